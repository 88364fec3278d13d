# The two commands: `make deploy` and `make test` (see README). Run as root on Debian 12.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
ANSIBLE_PLAYBOOK := $(VENV)/bin/ansible-playbook
export PATH := $(abspath $(VENV))/bin:$(PATH)
export ANSIBLE_CONFIG := $(abspath ansible.cfg)

.PHONY: deploy test venv lab-up lab-down lab-purge lint pytest molecule bench-deploy clean

deploy: venv lab-up  ## venv (with .venv/bin/glm5) + lab + site.yml
	$(ANSIBLE_PLAYBOOK) site.yml

test: venv lint lab-up pytest molecule  ## lint + pytest + Molecule

$(VENV)/.installed: requirements.txt requirements-lab.txt
	command -v python3 >/dev/null || { apt-get update && apt-get install -y python3 python3-venv; }
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-lab.txt
	touch $@

# The day-2 ops command (scripts/glm5.py) on the venv's PATH: .venv/bin/glm5
$(VENV)/bin/glm5: $(VENV)/.installed
	printf '#!/bin/sh\n# glm5, the day-2 ops command: scripts/glm5.py (installed by make)\nexec "%s" "%s" "$$@"\n' \
		"$(abspath $(PY))" "$(abspath scripts/glm5.py)" > $@
	chmod 0755 $@

venv: $(VENV)/.installed $(VENV)/bin/glm5

lab-up: venv  ## start the lab (idempotent)
	$(ANSIBLE_PLAYBOOK) ansible/playbooks/lab_up.yml

lab-down: venv  ## stop lab containers and fakepve; state is kept
	$(PY) scripts/lab/labd.py stop

lab-purge: venv  ## destroy lab containers and forget the lab's API state; host caches stay
	$(PY) scripts/lab/labd.py purge

lint: venv
	$(VENV)/bin/yamllint -s .
	$(VENV)/bin/ruff check ansible scripts tests molecule
	$(VENV)/bin/ansible-lint --profile production --offline

pytest: venv lab-up
	GLM5_LAB=1 $(VENV)/bin/pytest -q

molecule: venv lab-up
	$(VENV)/bin/molecule test --all

bench-deploy: venv  ## deploy benchmark (by hand; destroys and recreates the lab container)
	$(PY) scripts/bench_deploy.py

clean:
	rm -rf $(VENV)
