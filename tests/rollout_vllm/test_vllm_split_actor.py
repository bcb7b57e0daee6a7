"""A vLLM rollout next to a tensor-parallel actor: the weights reach the engine through the bucketed resharding
(``engine/reshard.py`` via ``RolloutHost.sync_weights``), each of the 2 gloo ranks gathering one bucket of the split
weights at a time, and the synced engine generates greedily exactly what a vLLM engine started from the same
weights saved to disk generates (``split_actor_rank.py``; rank 1 checks its hf engine the same way).  ~1 min: two
vLLM engines start on rank 0."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_tp2_actor_syncs_into_vllm_in_buckets_and_generates_as_from_disk(varied_model_dir, tmp_path):
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "OMP_NUM_THREADS": "1"}
    logs = [open(tmp_path / f"rank{r}.log", "w") for r in range(2)]
    procs = [subprocess.Popen([sys.executable, str(HERE / "split_actor_rank.py"), str(r), port, varied_model_dir,
                               str(tmp_path)], env=env, stdout=f, stderr=subprocess.STDOUT) for r, f in enumerate(logs)]
    try:
        for p in procs:
            p.wait(timeout=400)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in logs:
            f.close()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r}:\n{(tmp_path / f'rank{r}.log').read_text()[-4000:]}"
    for r in range(2):
        result = json.loads((tmp_path / f"result{r}.json").read_text())
        print(f"\nrank {r}: sync {result['sync']}")
        assert result["synced"] != result["before"]  # the step changed what the engine generates
        assert result["synced"] == result["disk"]
        # streamed in buckets of 64 KiB: never the whole model at once
        assert result["sync"]["update_weights/buckets"] > 1
        assert result["sync"]["update_weights/max_bucket_bytes"] < result["sync"]["update_weights/bytes"]
