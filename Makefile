# Two commands do all the set-up on a fresh machine:
#   make demo   - create .venv, install, check the machine (alignflow doctor), run the demo experiment on the
#                 embedded default (three local hosts); everything it writes goes to $ALIGNFLOW_STATE_DIR
#                 (default ./.alignflow)
#   make test   - create .venv, install, run the whole test suite (make test-unit: the one-minute tier)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)
# MindFormers 2.1.0 pins a MindSpore PyPI lacks and hyper-parallel, which is not on PyPI: the `mindformers-cpu`
# extra brings its other requirements, then the wheel itself goes in without dependencies (tests/lab).
MINDFORMERS := 2.1.0
MF_STAMP := $(VENV)/.mindformers-$(MINDFORMERS)-$(shell sha256sum pyproject.toml | cut -c1-12)
# Every checked megatron-core release side by side (+ triton, which 0.18+ imports), for tests/recipes/test_megatron_core.py:
# alignflow/frameworks/megatron_versions.py (CHECKED_RELEASES) lists them, megatron_installs.py installs them.
MCORE_STAMP := $(VENV)/megatron-core/.stamp-$(shell cat alignflow/frameworks/megatron_versions.py alignflow/frameworks/megatron_installs.py | sha256sum | cut -c1-12)
PYTEST_ARGS ?=
# Python caches compiled modules (prefect, torch, the tests' rewritten asserts) between runs: an environment that
# turns that off makes every test session compile them again (collection takes ~30% longer).
unexport PYTHONDONTWRITEBYTECODE
# The unit tier runs on this many processes (its tests start none, share nothing).
UNIT_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
# The whole suite: one worker per core (two to four) and one more, the lane of the groups that mostly wait on sshd,
# Slurm or servers (tests/scheduling.py): measured on 2 cores, two workers kept them 89% busy, this 97%. Each module
# runs on one worker, the modules of one lab (sshd, Slurm) one after the other, longest groups first
# (tests/conftest.py: GROUP_OF_FIXTURE, MEASURED_S; --no-loadscope-reorder keeps that order).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -lt 2 ] && n=2; [ $$n -gt 4 ] && n=4; echo $$((n + 1)))

.PHONY: venv demo test test-unit test-floors lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -U pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[demo,convert,test,postgres,mindformers-cpu]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

$(MF_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps mindformers==$(MINDFORMERS)
	rm -f $(VENV)/.mindformers-*
	touch $(MF_STAMP)

$(MCORE_STAMP): $(STAMP)
	$(BIN)/python -m alignflow.frameworks.megatron_installs install $(VENV)/megatron-core
	rm -f $(VENV)/megatron-core/.stamp-*
	touch $(MCORE_STAMP)

venv: $(STAMP) $(MF_STAMP) $(MCORE_STAMP)

demo: $(STAMP) $(MF_STAMP)
	$(BIN)/alignflow doctor
	$(BIN)/alignflow run experiments/demo.yaml

test: $(STAMP) $(MF_STAMP) $(MCORE_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

# The fast tier: no real process (sshd, PostgreSQL, Prefect, trainings); under a minute on 2 cores.
test-unit: $(STAMP)
	ALIGNFLOW_TEST_TIER=unit $(BIN)/python -m pytest -q -n $(UNIT_WORKERS) -m "not integration and not slow and not gpu" \
		$(PYTEST_ARGS)

# The declared floors (issue 50): every direct dependency of pyproject.toml pinned to its lower bound (.ci/floors.py)
# in an environment of its own, the rest (torch, the frameworks, the test tools) taken from .venv behind it; then the
# CLI's help and the unit tier on it. A lower bound in pyproject.toml is one the code was seen to run with.
FLOORS := $(VENV)/floors
test-floors: $(STAMP) $(MF_STAMP)
	rm -rf $(FLOORS) && $(BIN)/python -m venv --without-pip $(FLOORS)
	$(BIN)/python .ci/floors.py > $(FLOORS)/floors.txt
	$(BIN)/python -m pip --python $(FLOORS)/bin/python install -q --disable-pip-version-check \
		-c $(FLOORS)/floors.txt -r $(FLOORS)/floors.txt
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
		> "$$($(FLOORS)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-alignflow-venv.pth"
	$(FLOORS)/bin/python -m alignflow --help > /dev/null
	$(FLOORS)/bin/python .ci/floors.py --check
	ALIGNFLOW_TEST_TIER=unit $(FLOORS)/bin/python -m pytest -q -n $(UNIT_WORKERS) -p no:cacheprovider \
		-m "not integration and not slow and not gpu" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check alignflow tasks flows tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	if [ -x $(BIN)/alignflow ]; then $(BIN)/alignflow server stop; fi
	rm -rf .alignflow .pytest_cache .mypy_cache .ruff_cache
