"""Faults injected into the ``hf`` engine of a whole training run (no hook in the product).

A run imports this module in every process that builds a model through verl's
``actor_rollout_ref.model.external_lib=engine_fault_injection`` (with this folder on ``PYTHONPATH``); at
import it patches :class:`~hybridflow.rollout.hf.batcher.ContinuousBatcher` according to
``HYBRIDFLOW_INJECT_FAULT``:

* ``admission`` -- laying out the cache rows of new requests raises;
* ``prefill`` -- the prefill forward raises a CUDA-style out-of-memory error;
* ``decode`` -- the decode forward raises;
* ``nan_prefill`` / ``nan_decode`` -- the logits of the prefill / decode forward are NaN (a diverged policy);
* ``cache_signature`` -- the KV cache's ``update`` takes other arguments than transformers passes (what a
  transformers release that changes the cache protocol does);
* ``stall_decode`` -- the second decode forward never returns (for the stall watchdog).

When the fault fires, the time (``time.time()``) is appended to ``HYBRIDFLOW_INJECT_FAULT_STAMP`` (a file), so a
test can measure how long the run took to exit after it.
"""

from __future__ import annotations

import os
import threading
import time

import torch

from hybridflow.rollout.hf import batcher as hf_batcher
from hybridflow.rollout.hf.batcher import ContinuousBatcher
from hybridflow.rollout.hf.kv_cache import SlotKVCache

FAULT = os.environ.get("HYBRIDFLOW_INJECT_FAULT", "")
MESSAGES = {
    "admission": "injected admission fault",
    "prefill": "CUDA out of memory. Tried to allocate 20.00 GiB (injected prefill fault)",
    "decode": "injected decode fault",
    "nan_prefill": "non-finite logits",
    "nan_decode": "non-finite logits",
    "cache_signature": "TypeError",
    "stall_decode": "made no progress",
}
_phase = threading.local()


def _stamp() -> None:
    path = os.environ.get("HYBRIDFLOW_INJECT_FAULT_STAMP")
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time()}\n")


def _raising(message: str):
    def fault(*args, **kwargs):
        _stamp()
        raise RuntimeError(message)

    return fault


def install(fault: str) -> None:
    """Patch the batcher for ``fault`` (see the module docstring); ``""`` patches nothing."""
    if fault == "admission":
        ContinuousBatcher._layout = _raising(MESSAGES["admission"])
    elif fault == "prefill":
        hf_batcher.run_prefill = _raising(MESSAGES["prefill"])
    elif fault == "decode":
        ContinuousBatcher._decode = _raising(MESSAGES["decode"])
    elif fault in ("nan_prefill", "nan_decode"):
        _install_nan("prefill" if fault == "nan_prefill" else "decode")
    elif fault == "cache_signature":
        def update(self, key_states, value_states, *, kwargs=None):  # not what transformers passes: a TypeError
            raise AssertionError("never reached: the call itself does not bind")

        SlotKVCache.update = update
        real_start = ContinuousBatcher._start

        def start(self, *args, **kwargs):
            _stamp()
            return real_start(self, *args, **kwargs)

        ContinuousBatcher._start = start
    elif fault == "stall_decode":
        real_decode = ContinuousBatcher._decode
        calls = [0]

        def slow_decode(self):
            calls[0] += 1
            if calls[0] == 2:
                _stamp()
                time.sleep(3600)
            return real_decode(self)

        ContinuousBatcher._decode = slow_decode
    elif fault:
        raise ValueError(f"HYBRIDFLOW_INJECT_FAULT={fault!r}: known faults are {sorted(MESSAGES)}")


def _install_nan(phase: str) -> None:
    real_sample = hf_batcher.sample_next_tokens
    real_start, real_decode = ContinuousBatcher._start, ContinuousBatcher._decode

    def sample(logits, *args, **kwargs):
        if getattr(_phase, "name", None) == phase:
            _stamp()
            logits = torch.full_like(logits, float("nan"))
        return real_sample(logits, *args, **kwargs)

    def tagged(name, method):
        def run(self, *args, **kwargs):
            _phase.name = name
            try:
                return method(self, *args, **kwargs)
            finally:
                _phase.name = None

        return run

    hf_batcher.sample_next_tokens = sample
    ContinuousBatcher._start = tagged("prefill", real_start)
    ContinuousBatcher._decode = tagged("decode", real_decode)


install(FAULT)
