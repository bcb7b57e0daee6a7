"""Test-only: with ``HYBRIDFLOW_INJECT_VLLM_FAULT=server_step``, the engine core of a vLLM server process started
with this folder on ``PYTHONPATH`` raises from its first step (see ../vllm_fault_injection.py).  The patch is
applied when vLLM's engine-core module is imported, so no other process pays for importing vLLM."""

import importlib.abc
import importlib.util
import os
import sys
import time

_TARGET = "vllm.v1.engine.core"
MESSAGE = "injected vLLM server engine-core fault"


def _patch(module) -> None:
    real_step = module.EngineCore.step

    def step(self, *args, **kwargs):
        path = os.environ.get("HYBRIDFLOW_INJECT_FAULT_STAMP")
        if path:
            with open(path, "a") as f:
                f.write(f"{time.time()}\n")
        raise RuntimeError(MESSAGE)

    step.__wrapped__ = real_step
    module.EngineCore.step = step


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched_exec(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = patched_exec
        return spec


if os.environ.get("HYBRIDFLOW_INJECT_VLLM_FAULT") == "server_step":
    sys.meta_path.insert(0, _Finder())
