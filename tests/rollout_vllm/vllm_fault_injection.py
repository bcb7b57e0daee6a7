"""Faults injected into vLLM for the engine-failure tests (no hook in the product).

* :func:`install_step_fault` patches the in-process engine (``LLMEngine.step``) to raise once hybridflow has
  added a request (the start-up warm-up request passes): what a colocated vLLM engine whose forward raises
  does.  A whole run imports this module through ``actor_rollout_ref.model.external_lib=vllm_fault_injection``
  with ``HYBRIDFLOW_INJECT_VLLM_FAULT=engine_step``.
* ``fault_site/sitecustomize.py`` does the same to the engine core of a vLLM *server* process
  (``HYBRIDFLOW_INJECT_VLLM_FAULT=server_step``, the folder on ``PYTHONPATH``).

When the fault fires, ``time.time()`` is appended to ``HYBRIDFLOW_INJECT_FAULT_STAMP`` (a file), if set.
"""

from __future__ import annotations

import os
import time

MESSAGE = "injected vLLM engine step fault"
WARMUP_ID = "hybridflow-warmup"


def stamp() -> None:
    path = os.environ.get("HYBRIDFLOW_INJECT_FAULT_STAMP")
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time()}\n")


def install_step_fault(engine_cls=None) -> None:
    """``engine_cls.step`` (default vLLM's ``LLMEngine``) raises from the first step after a real request."""
    if engine_cls is None:
        from vllm.v1.engine.llm_engine import LLMEngine as engine_cls
    real_add, real_step = engine_cls.add_request, engine_cls.step
    armed = []

    def add_request(self, request_id, *args, **kwargs):
        if not str(request_id).startswith(WARMUP_ID):
            armed.append(request_id)
        return real_add(self, request_id, *args, **kwargs)

    def step(self, *args, **kwargs):
        if armed:
            stamp()
            raise RuntimeError(MESSAGE)
        return real_step(self, *args, **kwargs)

    engine_cls.add_request, engine_cls.step = add_request, step


if os.environ.get("HYBRIDFLOW_INJECT_VLLM_FAULT") == "engine_step":
    install_step_fault()
