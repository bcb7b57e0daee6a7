"""``AgentLoopManager``: the trainer's one generation call, ``generate_sequences(prompts) -> rollout batch``.

For every prompt row it runs ``n`` trajectories (``rollout.n``, or ``val_kwargs.n`` when validating;
rows come back interleaved: the n samples of a prompt adjacent).  The rows are split over
``rollout.agent.num_workers`` agent-loop workers -- Ray actors, or objects in this process with
``trainer.backend=local`` -- and the fleet's replicas are woken up before and put to sleep after.

Each trajectory gets a request id and, when sampling, a seed derived from (``rollout.seed``, train or
validation, step, row, sample): its draws depend on nothing else, so a resumed run or a run on another
number of ranks samples the same tokens.

An engine failure (:class:`~hybridflow.rollout.base.EngineError`) raised by any trajectory ends the whole
generation at once with that error (its message carries the engine's traceback): the other trajectories are
cancelled, the replicas are put back to sleep on a best-effort basis, and the trainer stops.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Sequence

import numpy as np

from hybridflow.agents.loop_worker import AgentLoopWorker, split_rows, stack_outputs
from hybridflow.agents.reward_loop import ScorerClient, TrajectoryScorer, reward_loop_applies
from hybridflow.config.v1 import v1_settings
from hybridflow.protocol import DataProto
from hybridflow.rollout.base import EngineError
from hybridflow.rollout.service.fleet import RolloutFleet
from hybridflow.rollout.service.replica import InProcessReplica
from hybridflow.rollout.service.server_manager import derive_seed
from hybridflow.utils.threads import CallTimeout, call_with_timeout, run_async

__all__ = ["AgentLoopManager", "summarize_trajectory_metrics", "concurrent_trajectories", "rollout_stream_threads"]

logger = logging.getLogger(__name__)

_SLEEP_AFTER_FAILURE_S = 10.0  # putting the replicas back to sleep after a failed generation: best effort


class AgentLoopManager:
    """Runs agent loops for the trainer on ``fleet``'s replicas.

    ``backend``: ``"ray"`` starts ``rollout.agent.num_workers`` worker actors (CPU-free: they wait on the
    engines and on tools); ``"local"`` runs the workers in this process on one event loop -- the in-process rollout
    server's own (:meth:`RolloutServer.run`), so that their requests reach the engine without crossing threads.  With verl's
    reward loop on (``reward_model.use_reward_loop``, see :mod:`hybridflow.agents.reward_loop`) training
    trajectories are scored as they finish, by ``reward_manager`` (in this process) or by a scorer actor.
    """

    def __init__(self, config, fleet: RolloutFleet, backend: str, tokenizer=None, processor=None,
                 reward_manager=None):
        self.config = config
        self.rollout_config = config.actor_rollout_ref.rollout
        self.fleet = fleet
        self.backend = backend
        self.tokenizer = tokenizer
        self.processor = processor
        num_workers = agent_worker_count(self.rollout_config.agent.num_workers, backend,
                                         concurrent_trajectories(config))
        scoring = reward_loop_applies(config)
        # On Ray, one worker scores in its own process (one process less to start); several share a scorer actor.
        own_scorer = scoring and backend != "local" and num_workers == 1
        self.scorer = _start_scorer(config, backend, reward_manager) if scoring and not own_scorer else None
        client = ScorerClient(self.scorer) if self.scorer is not None else None
        self._next_worker = 0
        if backend == "local":
            self.workers: list[Any] = [AgentLoopWorker(config, fleet.replicas, tokenizer, processor, scorer=client)
                                       for _ in range(num_workers)]
        else:  # the scorer's process starts while the workers' do; both are waited for here
            self.workers = _start_ray_workers(config, fleet.replicas, num_workers, client, own_scorer)
            if self.scorer is not None:
                _wait_ready([self.scorer], "reward_loop", "TrajectoryScorer")

    # ------------------------------------------------------------------ generation
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Rollout layout for ``n`` trajectories per prompt row, with trajectory statistics in
        ``meta_info["metrics"]`` and verl's ``agent_loop/*`` timings in ``meta_info["timing"]``."""
        if len(prompts) == 0:
            raise ValueError("generate_sequences: the prompt batch is empty")
        meta = dict(prompts.meta_info)
        validate = bool(meta.get("validate", False))
        rows = self.trajectory_rows(prompts, validate, int(meta.get("global_steps", 0)))
        self.fleet.wake_up(None if validate else meta.get("global_steps"))
        try:
            results = [r for part in self._run(rows) for r in part]
        except EngineError as err:
            self._sleep_after_failure()
            better = self._diagnosed(err)
            if better is err:
                raise
            raise better from err
        except BaseException:
            self._sleep_after_failure()
            raise
        self.fleet.sleep()
        batch = stack_outputs(self.tokenizer, self.rollout_config, [o for o, _ in results], self.processor)
        timing, metrics = summarize_trajectory_metrics([m for _, m in results], batch)
        batch.meta_info = {**meta, **batch.meta_info, "metrics": metrics, "timing": timing}
        return batch

    def trajectory_rows(self, prompts: DataProto, validate: bool, step: int, first_row: int = 0) -> DataProto:
        """The ``n`` trajectory rows of each prompt row, with request ids and seeds from (step, row, sample);
        ``first_row`` is the batch position of ``prompts``' first row (async training sends prompts one by
        one and keeps the seeds of the synchronous batch)."""
        rc = self.rollout_config
        src = rc.val_kwargs if validate else rc
        n = int(src.n)
        greedy = (not bool(src.do_sample)) or float(src.temperature) == 0.0
        rows = DataProto.from_dict(non_tensors=dict(prompts.non_tensor_batch), meta_info=dict(prompts.meta_info))
        rows = rows.repeat(n, interleave=True)
        tag = "val" if validate else "train"
        count = len(rows)
        rows.non_tensor_batch["__request_id__"] = np.array(
            [f"{tag}-{step}-{first_row + i // n}-{i % n}" for i in range(count)], dtype=object)
        seeds = [None if greedy else derive_seed(int(rc.seed), tag, step, first_row + i // n, i % n)
                 for i in range(count)]
        rows.non_tensor_batch["__seed__"] = np.array(seeds, dtype=object)
        return rows

    async def run_rows(self, rows: DataProto) -> list[tuple[Any, dict[str, float]]]:
        """Run trajectory rows (from :meth:`trajectory_rows`) on the next agent-loop worker; ``(output,
        metrics)`` per row.  Awaitable from any event loop, and leaves the fleet's wake/sleep to the caller:
        async training streams prompts through this while the replicas stay awake."""
        worker = self.workers[self._next_worker % len(self.workers)]
        self._next_worker += 1
        if self.backend == "local":
            return await worker.run_trajectories(rows)
        return await worker.run_trajectories.remote(rows)

    def _run(self, rows: DataProto) -> list[DataProto]:
        chunks = [rows.select_idxs(idx) for idx in split_rows(len(rows), len(self.workers))]
        if self.backend == "local":
            async def run_all():
                return await asyncio.gather(*(w.run_trajectories(c) for w, c in zip(self.workers, chunks)))

            server = self._home_server()
            if server is not None:  # on the engine's own loop: a request reaches the engine without a thread hop
                return list(server.run(run_all()))
            # a tool or scorer thread stuck in user code must not keep the loop from closing
            return list(run_async(run_all(), name="agent-loops"))
        from hybridflow.controller.errors import WorkerError
        from hybridflow.controller.ray_worker_group import wait_for_outputs
        from hybridflow.controller.worker_group import CallInfo

        refs = [w.run_trajectories.remote(c) for w, c in zip(self.workers, chunks)]
        info = CallInfo("agent_loop", "AgentLoopWorker", "run_trajectories", tuple(range(len(refs))))
        try:
            return wait_for_outputs(refs, info)
        except WorkerError as err:
            if isinstance(err.remote_cause, EngineError):  # the engine's own message, with its traceback
                raise EngineError(str(err.remote_cause)) from err
            raise

    def _home_server(self):
        """The in-process server whose loop the local agent loops run on (the first replica's), or None when the
        replicas live elsewhere (their own processes)."""
        replica = self.fleet.replicas[0] if self.fleet.replicas else None
        return replica.server if isinstance(replica, InProcessReplica) else None

    def _sleep_after_failure(self) -> None:
        """Put the replicas back to sleep after a failed generation, without letting a stuck or dead engine
        hold the error back: bounded, and a failure here is only logged."""
        try:
            call_with_timeout(self.fleet.sleep, _SLEEP_AFTER_FAILURE_S, name="rollout-sleep-after-failure")
        except CallTimeout:
            logger.warning("hybridflow: warning: the rollout replicas did not go back to sleep within %.0f s after "
                           "the generation failed", _SLEEP_AFTER_FAILURE_S)
        except Exception as exc:  # noqa: BLE001 - the generation's own error is the one to report
            cause = getattr(exc, "remote_cause", None) or exc.__cause__ or exc
            if not isinstance(cause, EngineError):  # a failed engine refusing to sleep says nothing new
                logger.warning("hybridflow: warning: putting the rollout replicas back to sleep after the failed "
                               "generation failed too: %s: %s", type(exc).__name__, str(exc).splitlines()[0])

    def _diagnosed(self, err: EngineError) -> EngineError:
        """``err``, or with the fleet's own account when it knows more: a server process that failed (its exit
        code and the first traceback of its log, where the client only saw a 500 or a closed connection)."""
        explain = getattr(self.fleet, "explain", None)
        check = getattr(self.fleet, "check", None)
        if explain is None and check is None:
            return err
        try:
            found = call_with_timeout(lambda: explain(err) if explain is not None else check(),
                                      _SLEEP_AFTER_FAILURE_S, name="rollout-health-check")
        except EngineError as raised:
            found = raised
        except Exception:  # noqa: BLE001 - no better account
            found = None
        if isinstance(found, EngineError) and str(found) not in str(err):
            return EngineError(f"{found}\n--- what the trajectories saw ---\n{err}")
        return err

    def shutdown(self) -> None:
        if self.backend != "local":
            import ray

            for w in self.workers + ([self.scorer] if self.scorer is not None else []):
                ray.kill(w, no_restart=True)
        self.workers, self.scorer = [], None


TRAJECTORIES_PER_AGENT_WORKER = 256


def agent_worker_count(configured: int | None, backend: str, trajectories: int | None = None) -> int:
    """``rollout.agent.num_workers``, or when null: min(8, CPUs, ceil(``trajectories`` / 256)).

    verl starts 8 workers whatever the batch; each Ray worker is a process (tokenizer, torch: ~250 MB and 2-3 CPU
    seconds of start-up), and one worker's event loop keeps a few hundred trajectories in flight at ~0.1 ms of
    its CPU each per turn.  So: one worker per 256 trajectories that can run at once, never more than the
    cluster's CPUs or verl's 8 (a 1,024 x 8 GRPO batch gets 8; a 32-trajectory test run gets 1).
    """
    if configured is not None:
        if int(configured) < 1:
            raise ValueError(f"actor_rollout_ref.rollout.agent.num_workers={configured}: need at least 1")
        return int(configured)
    if backend == "local":
        cpus = os.cpu_count() or 1
    else:
        import ray

        cpus = int(ray.cluster_resources().get("CPU", 1))
    wanted = -(-int(trajectories) // TRAJECTORIES_PER_AGENT_WORKER) if trajectories else 8
    return max(1, min(8, cpus, wanted))


def concurrent_trajectories(config) -> int:
    """How many trajectories can be in flight at once in this run (what rollout threads are sized by).

    Training: a generation round's prompts (``data.gen_batch_size``, else ``data.train_batch_size``) x
    ``rollout.n``; fully async training keeps up to ``(1 + staleness_threshold) x trigger_parameter_sync_step x
    train_batch_size`` prompts in flight.  Validation: ``data.val_batch_size x val_kwargs.n`` when the batch size is
    set (null = the whole set at once, unknown before the data is read: its requests then queue for threads when
    it has more trajectories than training, which only delays them).
    """
    data, rollout, at = config.data, config.actor_rollout_ref.rollout, config.async_training
    prompts = int(data.gen_batch_size or data.train_batch_size)
    v1 = v1_settings(config)
    if v1 is not None and v1.is_async:  # verl V1: warm-up batches in flight besides the step's own
        prompts = int(data.train_batch_size) * (1 + v1.num_warmup_batches)
    elif at.mode == "fully_async":
        per_version = int(data.train_batch_size) * int(at.trigger_parameter_sync_step)
        prompts = int(per_version * (1.0 + float(at.staleness_threshold)))
    demand = prompts * int(rollout.n)
    if data.val_files and data.val_batch_size:
        demand = max(demand, int(data.val_batch_size) * int(rollout.val_kwargs.n))
    return max(1, demand)


MAX_ROLLOUT_STREAM_THREADS = 1024


def rollout_stream_threads(config) -> int:
    """Threads a Ray rollout process gives to streamed request batches (its ``RAY_ROLLOUT_CONCURRENCY_GROUP``).

    Each agent-loop worker sends the requests of one event-loop tick as one streamed call, which holds a thread
    of that group until its last answer; so no more calls than trajectories in flight can be running, and no more
    than ``rollout.max_num_seqs`` can be generating at once (further calls would only wait in the engine).  Ray
    starts the group's threads with the process, so the size is the demand -- not ``max_num_seqs`` alone, which
    held ~1,050 idle threads per process with verl's default of 1024.
    """
    demand = concurrent_trajectories(config)
    return max(1, min(demand, int(config.actor_rollout_ref.rollout.max_num_seqs), MAX_ROLLOUT_STREAM_THREADS))


def _start_scorer(config, backend: str, reward_manager) -> Any:
    """The run's one trajectory scorer: the trainer's own manager in-process, or a Ray actor building its own."""
    if backend == "local":
        if reward_manager is None:
            return TrajectoryScorer(config)
        return TrajectoryScorer(manager=reward_manager)
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(TrajectoryScorer).remote(config)  # waited for by the caller


def _wait_ready(actors: list[Any], group: str, class_name: str) -> None:
    """Wait until Ray has constructed ``actors`` (a constructor's error is raised naming the class and rank)."""
    from hybridflow.controller.ray_worker_group import wait_for_outputs
    from hybridflow.controller.worker_group import CallInfo

    wait_for_outputs([a.ready.remote() for a in actors], CallInfo(group, class_name, "__init__",
                                                                  tuple(range(len(actors)))))


def _start_ray_workers(config, replicas, num_workers: int, scorer, own_scorer: bool = False) -> list[Any]:
    import ray

    remote = ray.remote(num_cpus=0, max_restarts=0)(AgentLoopWorker)
    workers = [remote.options(name=None).remote(config, list(replicas), scorer=scorer, own_scorer=own_scorer)
               for _ in range(num_workers)]
    _wait_ready(workers, "agent_loop", "AgentLoopWorker")
    return workers


def summarize_trajectory_metrics(per_trajectory: Sequence[dict[str, float]],
                                 batch: DataProto) -> tuple[dict[str, float], dict[str, float]]:
    """``(timing, metrics)`` of a batch of trajectories.

    ``timing`` holds verl's agent-loop timings, seconds only (the trainer logs them as ``timing_s/agent_loop/...``):
    ``{generate_sequences,tool_calls}/{min,max,mean}`` and ``slowest/{generate_sequences,tool_calls}``.  ``metrics``
    holds the rest: the slowest trajectory's ``agent_loop/slowest/{prompt_length,response_length}`` (tokens; verl
    files them with its timings, which would log token counts as ``timing_s/``), the trajectory statistics: model vs
    observation tokens, tool calls and tool errors per trajectory and the fraction of trajectories that called a
    tool (``agent/...``), and ``agent/error_count`` (trajectories whose loop failed).
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
    metrics["agent_loop/slowest/prompt_length"] = float(batch.batch["attention_mask"][slowest, :prompt_width].sum())
    metrics["agent_loop/slowest/response_length"] = float(batch.batch["attention_mask"][slowest, prompt_width:].sum())
    stats(metrics, "agent/model_tokens", "model_tokens")
    stats(metrics, "agent/observation_tokens", "observation_tokens")
    if any("tool_call_count" in m for m in per_trajectory):
        stats(metrics, "agent/tool_calls_per_trajectory", "tool_call_count")
        stats(metrics, "agent/tool_errors_per_trajectory", "tool_error_count")
        metrics["agent/tool_call_rate"] = float(np.mean([m.get("tool_call_count", 0.0) > 0 for m in per_trajectory]))
    metrics["agent/error_count"] = float(sum(m.get("error", 0.0) for m in per_trajectory))
    for key in sorted({k for m in per_trajectory for k in m if k.startswith("reward_loop/")}):
        # the scorer's error accounting, summed over its calls: reward/error_count, reward/timeout_count
        name = key.removeprefix("reward_loop/")
        if name.endswith("_count"):
            metrics[name] = float(sum(m.get(key, 0.0) for m in per_trajectory))
    metrics["agent/tokenization_mismatch_count"] = float(sum(m.get("tokenization_mismatch", 0.0) for m in per_trajectory))
    # model tokens the strict tokenization check left untrained (response_mask 0)
    metrics["agent/untrained_model_tokens"] = float(sum(m.get("untrained_model_tokens", 0.0) for m in per_trajectory))
    for kind in sorted({k for m in per_trajectory for k in m if k.startswith("tool_errors/")}):
        metrics[f"agent/{kind}"] = float(sum(m.get(kind, 0.0) for m in per_trajectory))
    return timing, metrics

