"""Checked weight loads inside vLLM's worker processes (``worker_extension_cls``).

The trainer writes weights (or a LoRA adapter) as safetensors under /dev/shm and records each tensor's digest
(:mod:`hybridflow.rollout.weights.delta`).  The vLLM worker -- in a server process, or the engine core's child
process -- reads the files back, recomputes every digest and loads only when all of them match: a file that is
not what the trainer wrote (a truncated or corrupted write, a stale folder) is refused, named, and the trainer
writes everything again.  Mixed into vLLM's worker class through ``worker_extension_cls``; its methods are
called with ``collective_rpc`` (arguments as JSON strings, as vLLM's dev endpoint passes them).
"""

from __future__ import annotations

import json
from pathlib import Path

from hybridflow.rollout.vllm.cpu_features import request_amx_tiles

__all__ = ["WeightCheckExtension", "EXTENSION", "verify_folder"]

# vLLM imports this module in every worker process hybridflow starts (engine core child, server): the process that
# runs the AMX attention kernel asks for the AMX tile permission here (cpu_features.py says why)
request_amx_tiles()

EXTENSION = "hybridflow.rollout.vllm.weight_check.WeightCheckExtension"


def verify_folder(folder: str, expected: dict[str, str]) -> list[str]:
    """Names whose tensor in ``folder``'s safetensors files does not have the expected digest (or is missing /
    unexpected)."""
    from safetensors import safe_open

    from hybridflow.rollout.weights.delta import digest

    bad, seen = [], set()
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                seen.add(name)
                if expected.get(name) != digest(f.get_tensor(name)).hex():
                    bad.append(name)
    bad.extend(sorted(set(expected) - seen))
    return bad


class WeightCheckExtension:
    """Methods added to vLLM's worker (see the module docstring)."""

    def reload_checked(self, weights_path: str, checksums: str) -> dict:
        """Verify the folder, then ``reload_weights`` from it; ``{"mismatch": [names]}`` (nothing loaded if any)."""
        bad = verify_folder(weights_path, json.loads(checksums))
        if not bad:
            self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return {"mismatch": bad}

    def check_folder(self, folder: str, checksums: str) -> dict:
        """Verify only (a LoRA adapter, loaded afterwards by the server's own adapter endpoint)."""
        return {"mismatch": verify_folder(folder, json.loads(checksums))}
