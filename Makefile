# make train   -> creates .venv, installs requirements, trains the MNIST sample
# make test    -> creates .venv with the test references, runs the unit tests and the end-to-end sample runs
# make test-fast -> the same without the tests marked slow
# make lint    -> ruff and the import-layer contract (pyproject.toml); make test runs it first
# make test-stress -> make test with every test process on one CPU core (two workers and the runs they start share
#                     it): flushes out tests that depend on the machine's speed or on one side of a race (Linux)
# JAX comes for the machine's accelerator (training/devices/accelerator.py): requirements-cuda12.txt where
# an NVIDIA GPU is visible, requirements-tpu.txt on a Cloud TPU VM, else requirements.txt (CPU).
# When that guess is wrong: make train ACCEL=cpu|cuda12|cuda13|tpu
# JAX 0.11 and later need Python 3.12 or newer: .venv is built with the first of these that runs and is new enough
# (a pyenv shim named python3.12 may exist yet not run), or with the one given as make PYTHON=/path/to/python3.12.
PYTHON_CANDIDATES := python3.12 python3.13 $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/3.1[23]*/bin/python) \
	python3
new_enough = $(shell $(1) -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && echo $(1))
PY := $(firstword $(foreach p,$(or $(PYTHON),$(PYTHON_CANDIDATES)),$(call new_enough,$(p))))
ifeq ($(PY)$(filter clean,$(MAKECMDGOALS)),)
$(error no Python 3.12 or newer among $(or $(PYTHON),$(PYTHON_CANDIDATES)) (JAX 0.12 needs one): install one, or name it with make PYTHON=/path/to/python3.12)
endif
VENV := .venv
BIN := $(VENV)/bin
# A .venv made with an older Python (before the move to JAX 0.12) is rebuilt from scratch.
VENV_TOO_OLD := $(if $(wildcard $(BIN)/python),$(if $(call new_enough,$(BIN)/python),,yes))
ACCELERATORS := cpu cuda12 cuda13 tpu
ifndef ACCEL
ACCEL := $(shell $(or $(PY),python3) -m training.devices.accelerator)
endif
ifneq ($(filter-out 1,$(words $(ACCEL)))$(filter-out $(ACCELERATORS),$(ACCEL)),)
$(error ACCEL=$(ACCEL): choose one of $(ACCELERATORS))
endif
REQUIREMENTS := $(if $(filter cpu,$(ACCEL)),requirements.txt,requirements-$(ACCEL).txt)
SAY_ACCEL = @echo "JAX for $(ACCEL) ($(if $(filter file,$(origin ACCEL)),detected,ACCEL=$(ACCEL) given); \
override with ACCEL=cpu|cuda12|cuda13|tpu): $(REQUIREMENTS)"
# The venv records the accelerator it was built for (none recorded: cpu, like venvs made before the choice); another
# choice rebuilds it from scratch, so no plugin of the previous one stays installed.
BUILT_FOR := $(or $(shell cat $(VENV)/accelerator 2>/dev/null),cpu)

.PHONY: train test test-fast test-stress lint bench clean

$(BIN)/python:
	$(if $(or $(filter-out $(BUILT_FOR),$(ACCEL)),$(VENV_TOO_OLD)),rm -rf $(VENV))
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(if $(filter-out cpu,$(ACCEL)),echo $(ACCEL) > $(VENV)/accelerator)

ifneq ($(ACCEL)$(VENV_TOO_OLD),$(BUILT_FOR))
.PHONY: $(BIN)/python
$(VENV)/.installed $(VENV)/.installed-dev: $(BIN)/python
endif

# requirements-litert.txt goes in without its declared dependencies: the file says why. It and the sweeps' PostgreSQL
# driver are optional features' files (new_project.py --without tflite,sweeps): named only where they exist.
$(VENV)/.installed: requirements.txt $(wildcard requirements-litert.txt) $(REQUIREMENTS) | $(BIN)/python
	$(SAY_ACCEL)
	$(BIN)/pip install --quiet -r $(REQUIREMENTS)
	$(if $(wildcard requirements-litert.txt),$(BIN)/pip install --quiet --no-deps -r requirements-litert.txt)
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt requirements.txt \
		$(wildcard requirements-sweeps-postgres.txt requirements-buckets.txt requirements-litert.txt) \
		$(REQUIREMENTS) | $(BIN)/python
	$(SAY_ACCEL)
	$(BIN)/pip install --quiet -r requirements-dev.txt$(if $(filter-out cpu,$(ACCEL)), -r $(REQUIREMENTS))
	$(if $(wildcard requirements-litert.txt),$(BIN)/pip install --quiet --no-deps -r requirements-litert.txt)
	touch $(VENV)/.installed $@

train: $(VENV)/.installed
	$(BIN)/python train.py -c config.json

# The architecture's checks first (pyproject.toml): ruff's lint and format, and the import layers, then the tests.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=. $(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist worksteal tests

test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n 2 -m "not slow" tests

test-stress: $(VENV)/.installed-dev
	taskset -c 0 $(BIN)/python -m pytest -q -n 2 --dist worksteal tests

clean:
	rm -rf $(VENV)
