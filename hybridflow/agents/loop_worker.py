"""``AgentLoopWorker``: runs the trajectories of a prompt chunk, one asyncio task per trajectory.

The manager sends each worker a chunk of rows (non-tensor columns only: ``raw_prompt``,
``raw_prompt_ids``, ``tools_kwargs``, ``agent_name``, ... plus ``__request_id__`` and ``__seed__``, which
the manager assigns so that the draws of a trajectory depend only on (run seed, step, row, sample)).
Every row runs its agent loop (``agent_name`` or ``rollout.agent.default_agent_loop``) concurrently; the
loops' model calls meet in the replicas' engines, which batch them.

A trajectory whose loop raises is not lost and does not stop the batch: it becomes an empty, untrained
trajectory (score 0 from the reward, ``response_mask`` 0) counted in ``agent/error_count``, with the first
traceback printed once and every traceback kept in the row's ``agent_error`` column (the trainer stops a
step where more than ``trainer.tolerated_failure_fraction`` of the trajectories failed, and names the first).
Only an engine failure (:class:`~hybridflow.rollout.base.EngineError`: a forward raised, non-finite logits, a
stalled or dead replica) stops the run at once, since every later request would fail too.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from typing import Any

import numpy as np

from hybridflow.agents.base import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    load_agent_loop_config,
    resolve_agent_loop,
)
from hybridflow.agents.postprocess import outputs_to_batch
from hybridflow.agents.tool_session import load_tools
from hybridflow.agents.trajectory_images import row_images
from hybridflow.protocol import DataProto
from hybridflow.rollout.base import EngineError
from hybridflow.rollout.service.replica import RolloutReplica
from hybridflow.rollout.service.server_manager import AsyncLLMServerManager

__all__ = ["AgentLoopWorker", "sampling_dict", "wants_log_probs", "TRAJECTORY_KEYS"]

# Columns the manager adds to every row and the worker consumes.
TRAJECTORY_KEYS = ("__request_id__", "__seed__")


def sampling_dict(rollout_config, validate: bool, log_probs: bool | None = None) -> dict[str, Any]:
    """verl's sampling-params dict for agent loops, from ``rollout`` (training) or ``rollout.val_kwargs``;
    ``log_probs`` (default ``rollout.calculate_log_probs``): the engines return each sampled token's log-prob."""
    src = rollout_config.val_kwargs if validate else rollout_config
    return {
        "temperature": float(src.temperature),
        "top_p": float(src.top_p),
        "top_k": int(src.top_k),
        "do_sample": bool(src.do_sample),
        "logprobs": bool(rollout_config.calculate_log_probs) if log_probs is None else bool(log_probs),
        "ignore_eos": bool(rollout_config.ignore_eos),
    }


def wants_log_probs(config, validate: bool = False) -> bool:
    """Training trajectories carry the rollout's log-probs with ``rollout.calculate_log_probs`` and whenever the
    drift detector compares them with the trainer's (``trainer.drift.enable``, on by default: a cheap gather of
    the sampled tokens' log-probs in the engine); they are pi_old only as the step plan decides."""
    rollout = config.actor_rollout_ref.rollout
    return bool(rollout.calculate_log_probs) or (not validate and bool(config.trainer.drift.enable))


class AgentLoopWorker:
    """One agent-loop worker (a Ray actor, or an object in the trainer's process for ``backend=local``).

    ``config`` is the typed ``PPOConfig``; ``tokenizer``/``processor`` are loaded from the model config
    when not given (in a Ray actor, where nothing is shared with the trainer).
    """

    def __init__(self, config, replicas: list[RolloutReplica], tokenizer=None, processor=None, scorer=None,
                 own_scorer: bool = False):
        from omegaconf import OmegaConf

        from hybridflow.config import config_to_dict

        self.config = config
        self.rollout_config = config.actor_rollout_ref.rollout
        if tokenizer is None:  # a Ray actor: nothing is shared with the trainer
            from hybridflow.engine.model_loader import load_processor, load_tokenizer

            mc = config.actor_rollout_ref.model
            tokenizer = load_tokenizer(mc.tokenizer_path or mc.path, mc.trust_remote_code, mc.custom_chat_template,
                                       field="actor_rollout_ref.model.tokenizer_path")
            processor = load_processor(mc.tokenizer_path or mc.path, mc.trust_remote_code, mc.custom_chat_template,
                                       field="actor_rollout_ref.model.tokenizer_path")
        self.tokenizer = tokenizer
        self.processor = processor
        self.server_manager = AsyncLLMServerManager(replicas, default_max_tokens=int(self.rollout_config.response_length))
        plain = OmegaConf.create(config_to_dict(config))
        self.trainer_config = DictConfigWrap(plain, typed=config)
        self.data_config = DictConfigWrap(plain.data, typed=config.data)
        mt = self.rollout_config.multi_turn
        # every loop gets the run's tools, as verl's worker passes them (``tools=ToolListWrap(...)``)
        self.tools = ToolListWrap(list(load_tools(mt.tool_config_path, getattr(mt, "function_tool_path", None)).values()))
        register_builtin_loops()
        if self.rollout_config.agent.agent_loop_config_path:
            load_agent_loop_config(self.rollout_config.agent.agent_loop_config_path)
        self._reported_error = False
        if own_scorer:  # the run's only worker on Ray: the reward loop's scorer lives in this process
            from hybridflow.agents.reward_loop import ScorerClient, TrajectoryScorer

            scorer = ScorerClient(TrajectoryScorer(config))
        self.scorer = scorer  # a ScorerClient when the agent loops score their own trajectories

    def ready(self) -> bool:
        """For the manager to wait until Ray actors are constructed."""
        return True

    async def run_trajectories(self, batch: DataProto) -> list[tuple[AgentLoopOutput, dict[str, float]]]:
        """Run every row's agent loop concurrently; ``(output, per-trajectory metrics)`` in row order."""
        validate = bool(batch.meta_info.get("validate", False))
        params = sampling_dict(self.rollout_config, validate, wants_log_probs(self.config, validate))
        default_agent = default_agent_loop(self.rollout_config)
        rows = [{k: v[i] for k, v in batch.non_tensor_batch.items()} for i in range(len(batch))]
        score = self.scorer is not None and not validate
        return list(await asyncio.gather(*(self._run_one(row, params, default_agent, score) for row in rows)))

    async def generate_sequences(self, batch: DataProto) -> DataProto:
        """verl's worker call: the rollout layout of this chunk (see ``postprocess``), per-trajectory metrics
        in ``meta_info["metrics"]``.  The manager stacks the whole batch at once instead (one layout)."""
        results = await self.run_trajectories(batch)
        out = stack_outputs(self.tokenizer, self.rollout_config, [o for o, _ in results], self.processor)
        out.meta_info["metrics"] = [m for _, m in results]
        return out

    async def _run_one(self, row: dict[str, Any], params: dict[str, Any], default_agent: str, score: bool = False):
        request_id = str(row.pop("__request_id__"))
        seed = row.pop("__seed__")
        agent_name = row.pop("agent_name", None) or default_agent
        sampling = dict(params, seed=int(seed)) if seed is not None else dict(params)
        start = time.perf_counter()
        try:
            cls, extra = resolve_agent_loop(str(agent_name))
            loop: AgentLoopBase = cls(trainer_config=self.trainer_config, server_manager=self.server_manager,
                                      tokenizer=self.tokenizer, processor=self.processor, dataset_cls=None,
                                      data_config=self.data_config, tools=self.tools, **extra)
            output = await loop.run(sampling, request_id=request_id, **row)
            if not isinstance(output, AgentLoopOutput):
                raise TypeError(f"agent loop {agent_name!r} returned {type(output).__name__}, not AgentLoopOutput")
            failed = 0.0
        except EngineError:  # the engine itself failed: the batch (and the run) cannot go on
            raise
        except Exception as exc:  # noqa: BLE001 - one trajectory's failure must not cost the batch
            self._report(agent_name, request_id, exc)
            output = self._failed_output(row, f"agent loop {agent_name!r} failed on trajectory {request_id}:\n"
                                         + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            failed = 1.0
        finally:
            self.server_manager.release(request_id)
        metrics = self._metrics(output, time.perf_counter() - start, failed)
        if score and output.reward_score is None:
            metrics.update(await self._score(output, row))
        return output, metrics

    async def _score(self, output: AgentLoopOutput, row: dict[str, Any]) -> dict[str, float]:
        """Score the finished trajectory now (the reward loop); its score rides in ``reward_score``."""
        result = await self.scorer.score_output(output, row, self._stack)
        output.reward_score = result["score"]
        output.extra_fields["reward_extra_info"] = result["extra"]
        output.extra_fields["reward_error"] = result.get("error")  # None, or why it could not be scored
        return {f"reward_loop/{k}": float(v) for k, v in result.get("metrics", {}).items()}

    def _stack(self, outputs: list[AgentLoopOutput]) -> DataProto:
        return stack_outputs(self.tokenizer, self.rollout_config, outputs, self.processor)

    def _failed_output(self, row: dict[str, Any], error: str) -> AgentLoopOutput:
        """The untrained stand-in for a trajectory whose loop raised; ``agent_error`` carries the traceback (the
        trainer names the first one when too many trajectories of a step failed)."""
        prompt = [int(t) for t in row.get("raw_prompt_ids") or []] or [self.tokenizer.pad_token_id or 0]
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        # One masked token gives the reward a place to sit; response_mask 0 keeps it out of every loss.
        images = row_images(row) if self.processor is not None and row.get("raw_prompt_ids") else []
        return AgentLoopOutput(prompt_ids=prompt, response_ids=[eos], response_mask=[0],
                               response_logprobs=[0.0] if wants_log_probs(self.config) else None,
                               multi_modal_data={"image": images} if images else None,  # the prompt's image tokens
                               num_turns=0, extra_fields={"agent_error": error})

    def _report(self, agent_name: str, request_id: str, exc: BaseException) -> None:
        if self._reported_error:
            return
        self._reported_error = True
        print(f"hybridflow: agent loop {agent_name!r} failed on trajectory {request_id} (counted in "
              f"agent/error_count; later failures are only counted):\n"
              + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), file=sys.stderr)

    @staticmethod
    def _metrics(output: AgentLoopOutput, seconds: float, failed: float) -> dict[str, float]:
        mask = output.response_mask
        timing = output.metrics.model_dump() if isinstance(output.metrics, AgentLoopMetrics) else dict(output.metrics)
        # the model's tokens of a trajectory the strict tokenization check masked are still the model's tokens
        untrained = float(output.extra_fields.get("untrained_model_tokens") or 0.0)
        metrics = {
            "generate_sequences": float(timing.get("generate_sequences", 0.0)),
            "tool_calls": float(timing.get("tool_calls", 0.0)),
            "num_preempted": float(timing.get("num_preempted", -1)),
            "seconds": seconds,
            "model_tokens": float(sum(mask)) + untrained,
            "observation_tokens": float(len(mask) - sum(mask)) - untrained,
            "untrained_model_tokens": untrained,
            "error": failed,
        }
        for key in ("tool_call_count", "tool_error_count"):
            if key in output.extra_fields:
                metrics[key] = float(output.extra_fields[key])
        metrics.update({k: float(v) for k, v in timing.items() if k.startswith("tool_errors/")})
        if "tokenization_mismatch" in output.extra_fields:
            metrics["tokenization_mismatch"] = 1.0
        return metrics


def stack_outputs(tokenizer, rollout_config, outputs: list[AgentLoopOutput], processor=None) -> DataProto:
    """``outputs_to_batch`` with the run's widths and the tokenizer's pad id (``processor``: a VLM's).  The
    ``agent_error`` column is always there (``None`` where the loop did not raise), so batches of different
    generation rounds (DAPO, async training) concatenate whether or not one of them had a failure."""
    pad = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    batch = outputs_to_batch(outputs, int(rollout_config.prompt_length), int(rollout_config.response_length), pad,
                             processor)
    if "agent_error" not in batch.non_tensor_batch:
        batch.non_tensor_batch["agent_error"] = np.full(len(batch), None, dtype=object)
    return batch


def default_agent_loop(rollout_config) -> str:
    """The loop of rows without ``agent_name``: ``rollout.agent.default_agent_loop``, except that
    ``multi_turn.enable=true`` turns the stock ``single_turn_agent`` default into ``tool_agent``."""
    name = rollout_config.agent.default_agent_loop
    if rollout_config.multi_turn.enable and name == "single_turn_agent":
        return "tool_agent"
    return name


def register_builtin_loops() -> None:
    """Importing the built-in loops registers them (``single_turn_agent``, ``tool_agent``)."""
    import hybridflow.agents.single_turn  # noqa: F401
    import hybridflow.agents.tool_agent  # noqa: F401


def split_rows(n: int, parts: int) -> list[np.ndarray]:
    """Row indices of ``n`` rows in ``parts`` contiguous, nearly equal chunks (empty chunks dropped)."""
    return [c for c in np.array_split(np.arange(n), max(1, parts)) if len(c)]
