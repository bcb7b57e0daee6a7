"""verl's reward loop: each training trajectory is scored as soon as its agent loop returns.

With ``reward_model.use_reward_loop=true`` (verl's default), no reward-model worker (``reward_model.enable
=false``) and a per-sample reward manager (``naive``, ``dapo``, ``prime``), scoring leaves the trainer's
``reward`` stage and overlaps generation: a finished trajectory is scored while the others still decode
or wait for tools (where slow scorers -- a sandbox running tests -- pay off).  The trainer's reward stage
then only reads ``rm_scores`` and the extra columns.  Validation batches keep scoring in the trainer
(the validation manager prints examples).

One :class:`TrajectoryScorer` serves all agent-loop workers of a run -- in the trainer's process for
``trainer.backend=local``, as one Ray actor for several Ray workers, inside the worker's process when a Ray run has
one -- so the reward manager's scoring processes exist once.
Trajectories finishing in the same event-loop tick are scored in one call (the manager spreads them over
its processes).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import numpy as np

from hybridflow.protocol import DataProto

__all__ = ["TrajectoryScorer", "ScorerClient", "reward_loop_applies", "PER_SAMPLE_MANAGERS"]

PER_SAMPLE_MANAGERS = ("naive", "dapo", "prime")


def reward_loop_applies(config) -> bool:
    """Whether agent loops score their own trajectories in this run (see the module docstring)."""
    rm = config.reward_model
    return (bool(rm.use_reward_loop) and not bool(rm.enable) and getattr(rm, "reward_loop_source", "register") == "register"
            and rm.reward_manager in PER_SAMPLE_MANAGERS)


class TrajectoryScorer:
    """The run's training reward manager (``manager``, or one built from ``config`` -- in a Ray actor),
    scoring rows of finished trajectories one call at a time."""

    def __init__(self, config=None, manager=None):
        import threading

        if manager is None:
            from hybridflow.engine.model_loader import load_tokenizer
            from hybridflow.rewards import load_reward_manager

            mc = config.actor_rollout_ref.model
            tokenizer = load_tokenizer(mc.tokenizer_path or mc.path, mc.trust_remote_code, mc.custom_chat_template,
                                       field="actor_rollout_ref.model.tokenizer_path")
            manager = load_reward_manager(config, tokenizer, num_examine=0)
        self.manager = manager
        self._lock = threading.Lock()  # the manager's scoring pool serves one call at a time

    def score(self, rows: DataProto) -> list[dict[str, Any]]:
        """Per row: ``{"score": float, "extra": {...}, "error": None or why it could not be scored}``; the call's
        error counts ride on the first row."""
        with self._lock:
            result = self.manager(rows, return_dict=True)
        scores = result["reward_tensor"].sum(dim=-1).tolist()
        extra = result.get("reward_extra_info", {})
        errors = result.get("reward_errors") or [None] * len(scores)
        out = [{"score": float(s), "extra": {k: v[i] for k, v in extra.items()}, "error": errors[i]}
               for i, s in enumerate(scores)]
        if out:
            out[0]["metrics"] = dict(result.get("reward_metrics", {}))
        return out

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        self.manager.close()


class ScorerClient:
    """How an agent-loop worker reaches the scorer (an object here, or a Ray actor handle), with the
    trajectories of one loop tick sent as one batch.

    :meth:`score_output` takes a finished trajectory as it is (an ``AgentLoopOutput`` and its row's columns) and
    lays out the whole tick at once with ``stack`` (one padded batch, instead of a one-row batch per trajectory
    concatenated: ~0.3 ms a trajectory); :meth:`score` takes a one-row ``DataProto``."""

    def __init__(self, scorer: Any):
        self.scorer = scorer
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._stack: Callable[[list], DataProto] | None = None
        self._scheduled = False

    def __getstate__(self) -> dict[str, Any]:
        return {"scorer": self.scorer}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["scorer"])

    async def score(self, row: DataProto) -> dict[str, Any]:
        return await self._enqueue(row)

    async def score_output(self, output: Any, columns: dict[str, Any], stack: Callable[[list], DataProto]):
        """Score one trajectory: ``stack(outputs)`` lays out the tick's trajectories (the agent-loop worker's
        ``stack_outputs``), ``columns`` are its row's non-tensor columns (data source, ground truth, ...)."""
        self._stack = stack
        return await self._enqueue((output, columns))

    async def _enqueue(self, item: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((item, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(lambda: loop.create_task(self._flush()))
        return await future

    def _rows(self, items: list[Any]) -> DataProto:
        if all(isinstance(i, tuple) for i in items):  # the common case: one layout for the whole tick
            return _with_columns(self._stack([o for o, _ in items]), [c for _, c in items])
        rows = [i if not isinstance(i, tuple) else _with_columns(self._stack([i[0]]), [i[1]]) for i in items]
        return DataProto.concat(_aligned(rows))

    async def _flush(self) -> None:
        batch, self._pending, self._scheduled = self._pending, [], False
        try:
            rows = self._rows([item for item, _ in batch])
            if hasattr(self.scorer, "score") and hasattr(self.scorer.score, "remote"):
                results = await self.scorer.score.remote(rows)
            else:
                results = await asyncio.to_thread(self.scorer.score, rows)
        except Exception as exc:  # noqa: BLE001 - every waiting trajectory learns it
            for _, f in batch:
                if not f.done():
                    f.set_exception(exc)
            return
        for (_, f), result in zip(batch, results):
            if not f.done():
                f.set_result(result)


def _with_columns(batch: DataProto, columns: list[dict[str, Any]]) -> DataProto:
    """``batch`` with each row's non-tensor ``columns`` (None where a row lacks one)."""
    for key in {k for c in columns for k in c}:
        column = np.empty(len(columns), dtype=object)
        for i, c in enumerate(columns):
            column[i] = c.get(key)
        batch.non_tensor_batch[key] = column
    return batch


def _aligned(rows: list[DataProto]) -> list[DataProto]:
    """The rows of one tick with the same non-tensor columns: a trajectory's optional extra fields
    (``tokenization_mismatch``, ``agent_error``) are None in the rows that lack them, as in the rollout batch."""
    keys = {k for r in rows for k in r.non_tensor_batch}
    for r in rows:
        for key in keys - set(r.non_tensor_batch):
            r.non_tensor_batch[key] = np.full(len(r), None, dtype=object)
    return rows
