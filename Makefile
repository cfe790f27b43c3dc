# make train   -> creates .venv, installs requirements, trains the MNIST sample
# make test    -> creates .venv with the test references, runs the unit tests and the end-to-end sample runs
# make test-fast -> the same without the tests marked slow
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: train test test-fast bench clean

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

clean:
	rm -rf $(VENV)
