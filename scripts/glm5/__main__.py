"""python -m glm5: the same as the glm5 console script."""
import sys

from glm5.cli import main

sys.exit(main())
