# Two commands matter: `make quickstart` (train a tiny model on CPU and watch it learn)
# and `make test` (the whole suite). Both create .venv on first use.
PY      ?= python3
VENV    := .venv
PIP     := $(VENV)/bin/pip
PYTHON  := $(VENV)/bin/python
# torch is pinned in every install step: an unpinned resolve pulls a multi-GB CUDA build.
TORCH   := torch==2.13.0
STAMP   := $(VENV)/.installed

.PHONY: venv test test-fast test-learning quickstart bench clean

$(STAMP): pyproject.toml
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	echo "$(TORCH)" > $(VENV)/constraints.txt
	$(PIP) install -q -c $(VENV)/constraints.txt -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PYTHON) -m pytest -q tests

test-fast: $(STAMP)
	$(PYTHON) -m pytest -q tests -m "not slow"

# the seeded mini-runs whose reward must climb (also part of test and test-fast)
test-learning: $(STAMP)
	$(PYTHON) -m pytest -q tests -m learning

quickstart: $(STAMP)
	$(VENV)/bin/hybridflow quickstart --output-dir outputs/quickstart

clean:
	rm -rf $(VENV) .pytest_cache outputs
