"""``AgentLoopManager``: the trainer's one generation call, ``generate_sequences(prompts) -> rollout batch``.

For every prompt row it runs ``n`` trajectories (``rollout.n``, or ``val_kwargs.n`` when validating;
rows come back interleaved: the n samples of a prompt adjacent).  The rows are split over
``rollout.agent.num_workers`` agent-loop workers -- Ray actors, or objects in this process with
``trainer.backend=local`` -- and the fleet's replicas are woken up before and put to sleep after.

Each trajectory gets a request id and, when sampling, a seed derived from (``rollout.seed``, train or
validation, step, row, sample): its draws depend on nothing else, so a resumed run or a run on another
number of ranks samples the same tokens.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import numpy as np

from hybridflow.agents.loop_worker import AgentLoopWorker, split_rows, stack_outputs
from hybridflow.protocol import DataProto
from hybridflow.rollout.fleet import RolloutFleet
from hybridflow.rollout.server_manager import derive_seed

__all__ = ["AgentLoopManager", "summarize_trajectory_metrics"]


class AgentLoopManager:
    """Runs agent loops for the trainer on ``fleet``'s replicas.

    ``backend``: ``"ray"`` starts ``rollout.agent.num_workers`` worker actors (CPU-free: they wait on the
    engines and on tools); ``"local"`` runs the workers in this process on one event loop.
    """

    def __init__(self, config, fleet: RolloutFleet, backend: str, tokenizer=None, processor=None):
        self.config = config
        self.rollout_config = config.actor_rollout_ref.rollout
        self.fleet = fleet
        self.backend = backend
        self.tokenizer = tokenizer
        num_workers = int(self.rollout_config.agent.num_workers)
        if num_workers < 1:
            raise ValueError(f"actor_rollout_ref.rollout.agent.num_workers={num_workers}: need at least 1")
        if backend == "local":
            self.workers: list[Any] = [AgentLoopWorker(config, fleet.replicas, tokenizer, processor)
                                       for _ in range(num_workers)]
        else:
            self.workers = _start_ray_workers(config, fleet.replicas, num_workers)

    # ------------------------------------------------------------------ generation
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Rollout layout for ``n`` trajectories per prompt row, with trajectory statistics in
        ``meta_info["metrics"]`` and verl's ``agent_loop/*`` timings in ``meta_info["timing"]``."""
        if len(prompts) == 0:
            raise ValueError("generate_sequences: the prompt batch is empty")
        meta = dict(prompts.meta_info)
        validate = bool(meta.get("validate", False))
        rows = self._trajectory_rows(prompts, validate, int(meta.get("global_steps", 0)))
        self.fleet.wake_up(None if validate else meta.get("global_steps"))
        try:
            results = [r for part in self._run(rows) for r in part]
        finally:
            self.fleet.sleep()
        batch = stack_outputs(self.tokenizer, self.rollout_config, [o for o, _ in results])
        timing, metrics = summarize_trajectory_metrics([m for _, m in results], batch)
        batch.meta_info = {**meta, "metrics": metrics, "timing": timing}
        return batch

    def _trajectory_rows(self, prompts: DataProto, validate: bool, step: int) -> DataProto:
        rc = self.rollout_config
        src = rc.val_kwargs if validate else rc
        n = int(src.n)
        greedy = (not bool(src.do_sample)) or float(src.temperature) == 0.0
        rows = DataProto.from_dict(non_tensors=dict(prompts.non_tensor_batch), meta_info=dict(prompts.meta_info))
        rows = rows.repeat(n, interleave=True)
        tag = "val" if validate else "train"
        count = len(rows)
        rows.non_tensor_batch["__request_id__"] = np.array(
            [f"{tag}-{step}-{i // n}-{i % n}" for i in range(count)], dtype=object)
        seeds = [None if greedy else derive_seed(int(rc.seed), tag, step, i // n, i % n) for i in range(count)]
        rows.non_tensor_batch["__seed__"] = np.array(seeds, dtype=object)
        return rows

    def _run(self, rows: DataProto) -> list[DataProto]:
        chunks = [rows.select_idxs(idx) for idx in split_rows(len(rows), len(self.workers))]
        if self.backend == "local":
            async def run_all():
                return await asyncio.gather(*(w.run_trajectories(c) for w, c in zip(self.workers, chunks)))

            return list(asyncio.run(run_all()))
        from hybridflow.controller.ray_worker_group import wait_for_outputs
        from hybridflow.controller.worker_group import CallInfo

        refs = [w.run_trajectories.remote(c) for w, c in zip(self.workers, chunks)]
        info = CallInfo("agent_loop", "AgentLoopWorker", "run_trajectories", tuple(range(len(refs))))
        return wait_for_outputs(refs, info)

    def shutdown(self) -> None:
        if self.backend != "local":
            import ray

            for w in self.workers:
                ray.kill(w, no_restart=True)
        self.workers = []


def _start_ray_workers(config, replicas, num_workers: int) -> list[Any]:
    import ray

    from hybridflow.controller.ray_worker_group import wait_for_outputs
    from hybridflow.controller.worker_group import CallInfo

    remote = ray.remote(num_cpus=0, max_restarts=0)(AgentLoopWorker)
    workers = [remote.options(name=None).remote(config, list(replicas)) for _ in range(num_workers)]
    info = CallInfo("agent_loop", "AgentLoopWorker", "__init__", tuple(range(num_workers)))
    wait_for_outputs([w.ready.remote() for w in workers], info)
    return workers


def summarize_trajectory_metrics(per_trajectory: Sequence[dict[str, float]],
                                 batch: DataProto) -> tuple[dict[str, float], dict[str, float]]:
    """``(timing, metrics)`` of a batch of trajectories.

    ``timing`` holds verl's agent-loop timings (the trainer logs them as ``timing_s/agent_loop/...``):
    ``{generate_sequences,tool_calls}/{min,max,mean}`` and ``slowest/*``.  ``metrics`` holds the
    trajectory statistics: model vs observation tokens, tool calls and tool errors per trajectory and the
    fraction of trajectories that called a tool (``agent/...``), and ``agent/error_count`` (trajectories whose loop failed).
    """
    if not per_trajectory:
        return {}, {}
    timing: dict[str, float] = {}
    metrics: dict[str, float] = {}

    def stats(out: dict[str, float], prefix: str, key: str) -> None:
        values = np.array([m.get(key, 0.0) for m in per_trajectory], dtype=np.float64)
        out.update({f"{prefix}/min": float(values.min()), f"{prefix}/max": float(values.max()),
                    f"{prefix}/mean": float(values.mean())})

    stats(timing, "agent_loop/generate_sequences", "generate_sequences")
    stats(timing, "agent_loop/tool_calls", "tool_calls")
    slowest = int(np.argmax([m.get("seconds", 0.0) for m in per_trajectory]))
    timing["agent_loop/slowest/generate_sequences"] = per_trajectory[slowest].get("generate_sequences", 0.0)
    timing["agent_loop/slowest/tool_calls"] = per_trajectory[slowest].get("tool_calls", 0.0)
    prompt_width = batch.batch["prompts"].shape[1]
    timing["agent_loop/slowest/prompt_length"] = float(batch.batch["attention_mask"][slowest, :prompt_width].sum())
    timing["agent_loop/slowest/response_length"] = float(batch.batch["attention_mask"][slowest, prompt_width:].sum())
    stats(metrics, "agent/model_tokens", "model_tokens")
    stats(metrics, "agent/observation_tokens", "observation_tokens")
    if any("tool_call_count" in m for m in per_trajectory):
        stats(metrics, "agent/tool_calls_per_trajectory", "tool_call_count")
        stats(metrics, "agent/tool_errors_per_trajectory", "tool_error_count")
        metrics["agent/tool_call_rate"] = float(np.mean([m.get("tool_call_count", 0.0) > 0 for m in per_trajectory]))
    metrics["agent/error_count"] = float(sum(m.get("error", 0.0) for m in per_trajectory))
    metrics["agent/tokenization_mismatch_count"] = float(sum(m.get("tokenization_mismatch", 0.0) for m in per_trajectory))
    for kind in sorted({k for m in per_trajectory for k in m if k.startswith("tool_errors/")}):
        metrics[f"agent/{kind}"] = float(sum(m.get(kind, 0.0) for m in per_trajectory))
    return timing, metrics

