# make train   -> creates .venv, installs requirements, trains the MNIST sample
# make test    -> creates .venv with the test references, runs the unit tests and the end-to-end sample runs
# make test-fast -> the same without the tests marked slow
# make test-stress -> make test with every test process on one CPU core (two workers and the runs they start share
#                     it): flushes out tests that depend on the machine's speed or on one side of a race (Linux)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: train test test-fast test-stress bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $(VENV)/.installed $@

train: $(VENV)/.installed
	$(BIN)/python train.py -c config.json

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n 2 tests

test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n 2 -m "not slow" tests

test-stress: $(VENV)/.installed-dev
	taskset -c 0 $(BIN)/python -m pytest -q -n 2 tests

clean:
	rm -rf $(VENV)
