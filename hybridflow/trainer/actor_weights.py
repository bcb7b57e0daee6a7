"""The actor's side of the weight sync to rollout replicas that hold their own copy (split placement).

The trainer pushes the actor's weights to standalone replicas through the checkpoint engine (a bucketed broadcast
from the actor's rank 0, :class:`ActorWeightSource`) or, for standalone vLLM servers, as a delta taken on the
actor's rank 0 (:class:`ActorWeightExport`). The replicas are started by ``hybridflow/launch/rollout_service.py``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ActorWeightExport", "ActorWeightSource"]


class ActorWeightSource:
    """The trainer's side of the weight sync, on the actor worker group (its rank 0 sends)."""

    def __init__(self, actor_group: Any):
        self.group = actor_group

    def address(self) -> tuple[str, int]:
        return next(a for a in self.group.weight_sync_address() if a is not None)

    def connect(self, spec) -> None:
        self.group.connect_weight_sync(spec)

    def send(self, full: bool = False) -> dict[str, float]:
        return self.group.send_rollout_weights(full)[0]

    def commit(self, verified: bool) -> None:
        self.group.commit_rollout_weights(verified)

    def digest(self, names: list[str] | None = None) -> dict:
        """``{"names", "digest"}`` of the actor's current weights (every rank computes it; rank 0's is returned)."""
        return self.group.actor_weights_digest(names)[0]


class ActorWeightExport:
    """The actor's weights for standalone vLLM servers, as a delta taken on the actor's rank 0 (unchanged
    tensors never leave it): ``fetch(full)`` -> named tensors, ``stats()``, ``commit(verified)``."""

    def __init__(self, actor_group: Any):
        self.group = actor_group
        self._stats = None

    def fetch(self, full: bool = False):
        out = self.group.export_actor_weights(full)[0]
        self._stats = out["stats"]
        return out["tensors"].items()

    def stats(self):
        return self._stats

    def commit(self, verified: bool) -> None:
        self.group.commit_actor_weights(verified)
