# make train   -> creates .venv, installs requirements, trains the MNIST sample
# make test    -> creates .venv with the test references, runs the unit tests and the end-to-end sample runs
# make test-fast -> the same without the tests marked slow
# make lint    -> ruff and the import-layer contract (pyproject.toml); make test runs it first
# make test-stress -> make test with every test process on one CPU core (two workers and the runs they start share
#                     it): flushes out tests that depend on the machine's speed or on one side of a race (Linux)
# JAX comes for the machine's accelerator (training/platform.py, machine_accelerator): requirements-cuda12.txt where
# an NVIDIA GPU is visible, requirements-tpu.txt on a Cloud TPU VM, else requirements.txt (CPU).
# When that guess is wrong: make train ACCEL=cpu|cuda12|cuda13|tpu
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ACCELERATORS := cpu cuda12 cuda13 tpu
ifndef ACCEL
ACCEL := $(shell $(PYTHON) -m training.platform)
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
	$(if $(filter-out $(BUILT_FOR),$(ACCEL)),rm -rf $(VENV))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(if $(filter-out cpu,$(ACCEL)),echo $(ACCEL) > $(VENV)/accelerator)

ifneq ($(ACCEL),$(BUILT_FOR))
.PHONY: $(BIN)/python
$(VENV)/.installed $(VENV)/.installed-dev: $(BIN)/python
endif

$(VENV)/.installed: requirements.txt $(REQUIREMENTS) | $(BIN)/python
	$(SAY_ACCEL)
	$(BIN)/pip install --quiet -r $(REQUIREMENTS)
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt requirements.txt $(REQUIREMENTS) | $(BIN)/python
	$(SAY_ACCEL)
	$(BIN)/pip install --quiet -r requirements-dev.txt$(if $(filter-out cpu,$(ACCEL)), -r $(REQUIREMENTS))
	touch $(VENV)/.installed $@

train: $(VENV)/.installed
	$(BIN)/python train.py -c config.json

# The architecture's checks first (pyproject.toml): ruff's lint and format, and the import layers, then the tests.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=. $(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q -n 2 tests

test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n 2 -m "not slow" tests

test-stress: $(VENV)/.installed-dev
	taskset -c 0 $(BIN)/python -m pytest -q -n 2 tests

clean:
	rm -rf $(VENV)
