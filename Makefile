# make train   -> creates .venv, installs requirements, trains the MNIST sample
# make test    -> creates .venv with the test references, runs the unit tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: train test bench clean

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

clean:
	rm -rf $(VENV)
