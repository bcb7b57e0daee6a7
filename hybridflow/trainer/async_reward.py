"""``reward_model.launch_reward_fn_async``: score a batch in a background thread while the next stages run.

verl launches the reward function as a Ray task right after generation and collects it before the advantage
stage, so rule-based scoring (a math verifier, a code sandbox) overlaps the log-prob, reference and value
passes.  Here the reward manager runs in one background thread of the controller (it is I/O- or
subprocess-bound: ``reward_model.num_workers`` processes score in parallel behind it), on a *view* of the batch:
its own row dicts over the same tensors, so the stages that add keys to the batch meanwhile never touch what the
scorer reads.  The result is written into the batch with the same code as the synchronous path
(``stages.apply_reward_result``), so both give identical batches and metrics.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable

from hybridflow.protocol import DataProto, TensorBatch
from hybridflow.utils.stopping import wait_future
from hybridflow.utils.threads import DaemonExecutor

__all__ = ["AsyncRewardScorer"]


class AsyncRewardScorer:
    """One background scoring thread; ``launch`` returns at once, ``collect`` waits for the result."""

    def __init__(self, reward_fn: Callable[..., Any]):
        self.reward_fn = reward_fn
        # a daemon thread: a scorer stuck in user code never keeps the process alive
        self._pool = DaemonExecutor(max_workers=1, name="hybridflow-reward")

    def launch(self, batch: DataProto) -> Future:
        view = DataProto(TensorBatch(dict(batch.batch)), dict(batch.non_tensor_batch), dict(batch.meta_info))
        return self._pool.submit(self.reward_fn, view, return_dict=True)

    @staticmethod
    def collect(pending: Future) -> dict[str, Any]:
        """The reward manager's result dict (re-raises the scorer's exception here, in the trainer's thread)."""
        return wait_future(pending, None, "the reward function")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
