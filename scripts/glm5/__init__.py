"""glm5: day-2 operations on the GLM-5 inference nodes of an Ansible inventory (the `glm5` console script).

Installed editable from the checkout (`make venv`: `uv pip install -e .`): the command drives this checkout's
playbooks and reads its role defaults, so it is the checkout's own code, never a second copy.
"""
