"""Durable rollouts: what the async and V1 modes generated survives a crash until it is trained
(``rollout_log.py``: the per-run log; ``wal.py``: the file; ``codec.py``: its JSON records)."""
