# The two commands: `make deploy` and `make test` (see README); `make check` is the quick loop. Run as root on
# Debian 12. tests/README.md is the map of the suite: its lanes, nodes and what each check proves.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
ANSIBLE_PLAYBOOK := $(VENV)/bin/ansible-playbook
MOLECULE := $(VENV)/bin/molecule
export PATH := $(abspath $(VENV))/bin:$(PATH)
export ANSIBLE_CONFIG := $(abspath ansible.cfg)
# Python's bytecode caches on: an environment that sets PYTHONDONTWRITEBYTECODE (CI's does) makes every import of
# sglang compile it again from source (26 s of CPU instead of 11), and the suite imports it dozens of times.
unexport PYTHONDONTWRITEBYTECODE

# Where make test keeps its measurements (JUnit XML of pytest and of every playbook, each step's wall time);
# `make durations` prints them as a table. A step run outside make test (make check's lint and unit, make deploy's
# lab-up, a lane by hand) keeps its log and times in build/step-reports instead, so that the table stays the last
# make test's alone: make test runs its steps with SUITE=1.
SUITE_REPORTS := build/test-reports
REPORTS := $(if $(SUITE),$(SUITE_REPORTS),build/step-reports)
# A step of the suite, timed and recorded: $(call step,<name>,<command>)
step = env GLM5_TEST_REPORTS=$(abspath $(REPORTS)) $(PY) scripts/suite_durations.py step $(1) -- $(2)
# lane-ct's steps run at a lower CPU priority (nice 10): the full-stack lane is the longer one, and its smoke tests
# time the engine at 8x the seeds' pace (at concurrency 64 a starved CPU failed their gates); lane-ct takes the CPU
# the other lane leaves.
ct_step = nice -n 10 $(call step,$(1),$(2))
# The playbooks' per-task times, as JUnit XML (Ansible's own junit callback), in the step's folder.
ansible_junit = ANSIBLE_CALLBACKS_ENABLED=ansible.builtin.junit,ansible.posix.timer JUNIT_OUTPUT_DIR=$(abspath $(REPORTS))/$(1)
failed = { $(PY) scripts/suite_durations.py failed $(SUITE_REPORTS); exit 1; }
PYTEST = env GLM5_LAB=1 $(VENV)/bin/pytest -q -p no:cacheprovider --durations=10

.PHONY: deploy test check venv lab-up lab-down lab-purge lint unit lanes lane-stack lane-ct \
        host-checks durations bench-deploy clean

deploy: venv lab-up  ## venv (with .venv/bin/glm5) + lab + site.yml
	$(ANSIBLE_PLAYBOOK) site.yml

# Everything, as CI runs it: lint and the no-lab tests beside bringing the lab up, then the two lanes side by side
# (the full-stack node and the container-stage node), then the checks that change the lab host itself, alone.
# A failure ends with what failed: the failed steps, their failed tests and tasks, the end of their logs.
test: venv
	rm -rf $(SUITE_REPORTS) && mkdir -p $(SUITE_REPORTS)
	$(MAKE) --no-print-directory -j3 SUITE=1 lint unit lab-up || $(failed)
	$(MAKE) --no-print-directory -j2 --output-sync=target SUITE=1 lanes || $(failed)
	$(MAKE) --no-print-directory SUITE=1 host-checks || $(failed)
	$(MAKE) --no-print-directory durations

# The quick loop (<= 3 minutes): lint beside every test that needs no lab (make -j2).
check: venv
	$(MAKE) --no-print-directory -j2 --output-sync=target lint unit

# The venv: uv (pinned in requirements-lab.txt) installs the pinned requirements in seconds where pip takes minutes.
$(VENV)/.installed: requirements.txt requirements-lab.txt
	command -v python3 >/dev/null || { apt-get update && apt-get install -y python3 python3-venv; }
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet "$$(grep -E '^uv==' requirements-lab.txt)"
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -r requirements-lab.txt
	touch $@

# The project itself, editable from this checkout (pyproject.toml): the `glm5` and `glm5-lab` console scripts.
$(VENV)/bin/glm5: $(VENV)/.installed pyproject.toml
	$(VENV)/bin/uv pip install --quiet --no-deps --python $(PY) -e .
	touch $@

# promtool (the alert rules' and Prometheus configuration's checker) from Debian's prometheus package, unpacked into the
# venv: installing the package here would start a Prometheus on this host. The containers install the package itself.
$(VENV)/bin/promtool: $(VENV)/.installed
	mkdir -p build/debs
	cd build/debs && { apt-get download prometheus 2>/dev/null || { apt-get update -qq && apt-get download prometheus; }; }
	dpkg-deb --fsys-tarfile "$$(ls -t build/debs/prometheus_*.deb | head -1)" | tar -xO ./usr/bin/promtool > $@.tmp
	chmod 0755 $@.tmp && mv $@.tmp $@ && $@ --version | head -1

venv: $(VENV)/.installed $(VENV)/bin/glm5 $(VENV)/bin/promtool

lab-up: venv  ## start the lab (idempotent)
	$(call step,lab-up,$(ANSIBLE_PLAYBOOK) ansible/playbooks/lab_up.yml)

lab-down: venv  ## stop lab containers and fakepve; state is kept
	$(VENV)/bin/glm5-lab stop

lab-purge: venv  ## destroy lab containers and forget the lab's API state; host caches stay
	$(VENV)/bin/glm5-lab purge

lint: venv
	$(call step,lint,bash -c 'set -e; $(VENV)/bin/yamllint -s .; $(VENV)/bin/ruff check ansible scripts tests molecule; \
		$(VENV)/bin/ansible-lint --profile production --offline -q')

# Tests that need no lab (no root, no LXC, no PyPI): filters, modules, parsers, fixtures, the report.
unit: venv
	$(call step,unit,$(PYTEST) -m 'not lab and not sglang' -n 2 --junitxml=$(REPORTS)/unit.xml)

lanes: lane-stack lane-ct

# The full-stack fleet (molecule/default's: nodes 192 and 196, the gateway 197), deployed once: site.yml, changed=0 on
# the second run, every role's verify and the smoke test's fault modes on the first node (molecule/default/verify.yml);
# then the ops command's, the history's and the lock's tests on the second node (pytest -m stack2, its own one-node
# inventory); then the rollout across both under load and the secrets audit (pytest -m stack). (Side by side, the
# verify and the second node's tests took longer, not shorter: the machine's two CPUs were already busy.)
# A failed run leaves the fleet for a look; the next run destroys it first and resets the Molecule state of every
# scenario of the lane (a scenario that still thinks it was created and prepared would skip building the node), and
# empties the lane's own bench histories (test data, never make deploy's: the checks read this run's history only).
STACK_HISTORY = $(PY) -c 'import sys; sys.path.insert(0, "tests"); import siterun; \
	print(" ".join(hv["pve_container_bench_history_dir"] for _, hv in siterun.scenario_hosts("default").values()))'
lane-stack: venv
	$(call step,stack-destroy-old,bash -c '$(MOLECULE) destroy -s default && $(MOLECULE) reset -s default')
	# (a killed run of tests/test_history_faults.py leaves its node's index immutable: chattr -i first)
	histories="$$($(STACK_HISTORY))" && test -n "$$histories" && { chattr -R -i $$histories 2>/dev/null || true; } \
		&& rm -rf $$histories
	$(call step,stack-molecule,env GLM5_LAB=1 $(call ansible_junit,stack-molecule) \
		$(MOLECULE) test -s default --destroy=never)
	$(call step,stack2-pytest,$(PYTEST) -m stack2 --junitxml=$(REPORTS)/stack2-pytest.xml)
	$(call step,stack-pytest,$(PYTEST) -m stack --junitxml=$(REPORTS)/stack-pytest.xml)
	$(call step,stack-destroy,$(MOLECULE) destroy -s default)

# The container-stage node (molecule/pve_container's inventory, vmid 190): the site.yml tests about the container and
# GPU plays build it with site.yml (less the SGLang plays) and run on it; it stays up for host-checks. (The roles'
# own verifies run on the full-stack node: molecule/default imports them.) Then the host-driver scenario (its own two
# containers), the other lab tests, the tests that install each profile's sglang on this machine, and the gateway
# scenario (its own container, in front of two engine emulators that use the sglang the step before cached).
lane-ct: venv
	$(call ct_step,ct-destroy-old,$(MOLECULE) destroy -s pve_container)
	$(call ct_step,ct-pytest,$(PYTEST) -m ct --junitxml=$(REPORTS)/ct-pytest.xml)
	$(call ct_step,host-driver-molecule,env GLM5_LAB=1 $(call ansible_junit,host-driver-molecule) \
		$(MOLECULE) test -s nvidia_host_driver)
	$(call ct_step,lab-pytest,$(PYTEST) -m 'lab and not stack and not stack2 and not ct and not host' --junitxml=$(REPORTS)/lab-pytest.xml)
	$(call ct_step,sglang-pytest,$(PYTEST) -m 'sglang' -n 2 --dist loadfile --junitxml=$(REPORTS)/sglang-pytest.xml)
	$(call ct_step,gateway-molecule,env GLM5_LAB=1 $(call ansible_junit,gateway-molecule) \
		$(MOLECULE) test -s sglang_gateway)

# Checks that change the lab host itself (a GPU device node moved away): run alone, after the lanes, on the
# container-stage node, which is then destroyed.
host-checks: venv
	$(call step,host-pytest,$(PYTEST) -m host --junitxml=$(REPORTS)/host-pytest.xml)
	$(call step,ct-destroy,$(MOLECULE) destroy -s pve_container)

# The measurements of the last make test, as a table (tests/README.md keeps the numbers of record).
durations: venv
	@$(PY) scripts/suite_durations.py table $(SUITE_REPORTS)

bench-deploy: venv  ## deploy benchmark (by hand; destroys and recreates the lab container)
	$(PY) scripts/bench_deploy.py

clean:
	rm -rf $(VENV) build
