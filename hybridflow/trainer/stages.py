"""The stages of one PPO/GRPO step, each a small function over a ``DataProto`` (HybridFlow, Sheng et al. 2025).

The step is the dataflow of the HybridFlow paper (§3, Fig. 4): generate -> reward -> old log-prob -> ref ->
values -> advantage -> update critic -> update actor -> weight sync.  Each stage reads the batch keys of the
contract in ``docs/architecture.md`` and adds its own; worker calls go through worker groups whose methods
dispatch over data-parallel ranks.  The PPO step (``ppo_step.py``) times and orders them; variants such as
ReMax's greedy baseline or DAPO's group filtering are options here, not copies of the loop.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from hybridflow.config.plan import StepPlan  # noqa: F401 - decided by the config's check pipeline
from hybridflow.protocol import DataProto
from hybridflow.utils.profiler import simple_timer as timed  # noqa: F401 - the stages' timer
from hybridflow.tracking.metrics import reduce_metrics
from hybridflow.algorithms.batch_ops import (
    OLD_LOG_PROBS_FROM_UPDATE,
    PI_OLD_DIAGNOSTICS_IN_UPDATE,
    compute_response_mask,
)

# Keys the rollout needs from a prompt batch; everything else stays on the controller's copy.
PROMPT_TENSOR_KEYS = ("input_ids", "attention_mask", "position_ids")


@dataclass
class WorkerGroups:
    """The controller's handles on the role worker groups (``None`` = role not used in this run).

    ``ref`` may be the same object as ``actor_rollout`` (actor_rollout_ref role, or LoRA where the
    reference is the actor with its adapter disabled).  ``rollout`` is the rollout service: the
    agent-loop manager whose ``generate_sequences`` is the one generation call (plain single-turn GRPO
    included), over the fleet of engine replicas it wakes, puts to sleep and feeds new weights.
    """

    actor_rollout: Any
    ref: Any = None
    critic: Any = None
    reward_model: Any = None
    rollout: Any = None
    teachers: Any = None  # on-policy distillation: the TeacherRouter (trainer/teachers.py)


# ---------------------------------------------------------------------------------------------- prepare
def prompts_from_loader(batch_dict: dict[str, Any]) -> DataProto:
    """A collated loader batch as a ``DataProto`` with a fresh ``uid`` per prompt (GRPO group id)."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    return batch


def split_generation_input(batch: DataProto) -> DataProto:
    """Move the prompt tensors out of ``batch`` into the rollout's input (non-tensors are shared).

    The rollout returns ``input_ids`` etc. for prompt+response; keeping the prompt-only versions on the
    controller copy would make the later union conflict.
    """
    gen = batch.pop(batch_keys=[k for k in PROMPT_TENSOR_KEYS if k in batch.batch])
    gen.non_tensor_batch = dict(batch.non_tensor_batch)
    gen.meta_info = dict(batch.meta_info)
    return gen


def merge_generation_output(batch: DataProto, output: DataProto) -> DataProto:
    """Add the rollout's tensors (and any new non-tensor columns) to ``batch``; returns ``batch``."""
    new_non_tensor = {k: v for k, v in output.non_tensor_batch.items() if k not in batch.non_tensor_batch}
    extra = DataProto.from_dict(dict(output.batch), new_non_tensor)
    batch.union(extra)
    if "multi_modal_inputs" in output.non_tensor_batch:  # the trajectory's pixels (tool images included) win
        batch.non_tensor_batch["multi_modal_inputs"] = output.non_tensor_batch["multi_modal_inputs"]
    for key in ("timing", "metrics"):
        if key in output.meta_info:
            batch.meta_info[f"gen_{key}"] = output.meta_info[key]
    if "reward_extra_keys" in output.meta_info:  # the agent loops scored the trajectories (reward loop)
        batch.meta_info["reward_extra_keys"] = list(output.meta_info["reward_extra_keys"])
    if "response_mask" not in batch.batch:
        batch.batch["response_mask"] = compute_response_mask(batch)
    return batch


# ---------------------------------------------------------------------------------------------- generate
def generate(groups: WorkerGroups, batch: DataProto, meta: dict[str, Any]) -> DataProto:
    """Sample responses; the rollout answers each prompt ``rollout.n`` times (``val_kwargs.n`` when validating).

    Its rows come back interleaved (the n samples of a prompt adjacent), so the controller's copy of the
    prompt batch is repeated the same way before the two are merged.  The rollout's statistics (agent-loop
    timing, turns, tool calls) are left in ``meta_info["gen_metrics"]``.
    """
    if len(batch) == 0:
        raise ValueError("generate: the prompt batch is empty")
    gen_input = split_generation_input(batch)
    gen_input.meta_info.update(meta)
    output = groups.rollout.generate_sequences(gen_input)
    n, rest = divmod(len(output), len(batch))
    if rest or n < 1:
        raise RuntimeError(f"the rollout returned {len(output)} rows for {len(batch)} prompts (not a multiple)")
    return merge_generation_output(batch.repeat(n, interleave=True), output)


def generate_remax_baseline(groups: WorkerGroups, prompts: DataProto, reward_fn: Callable) -> torch.Tensor:
    """ReMax (Li et al. 2024, "ReMax", Alg. 1): reward of the greedy response of each prompt, a per-prompt baseline.

    The greedy sample is drawn with the rollout's validation sampling (``rollout.val_kwargs``), which
    ``StepPlan`` checks is greedy.  Returns one scalar per prompt; the caller repeats it ``n`` times.
    """
    greedy = prompts.select()
    out = generate(groups, greedy, meta={"validate": True})
    scored = reward_fn(out, return_dict=True)
    per_row = scored["reward_tensor"].sum(dim=-1)
    return per_row.view(len(prompts), -1).mean(dim=-1)


# ---------------------------------------------------------------------------------------------- reward
def _numeric_means(columns: dict[str, Any]) -> dict[str, float]:
    """``reward_extra/<key>/mean`` of every all-numeric extra-info column."""
    out = {}
    for key, values in columns.items():
        numeric = [float(v) for v in values if isinstance(v, (bool, int, float, np.number))]
        if len(numeric) == len(values) and numeric:
            out[f"reward_extra/{key}/mean"] = float(np.mean(numeric))
    return out


def compute_reward(groups: WorkerGroups, batch: DataProto, reward_fn: Callable, use_rm: bool) -> dict[str, float]:
    """``token_level_scores`` from a reward model (``rm_scores``) or the rule reward manager.

    Reward extra info (``acc``, ``pred``, ``overlong``...) becomes non-tensor columns so DAPO filtering and
    validation can read it; numeric columns are also logged as ``reward_extra/<key>/mean``.
    """
    if use_rm and "rm_scores" not in batch.batch:
        batch.union(groups.reward_model.compute_rm_score(batch).select(batch_keys=["rm_scores"], non_tensor_batch_keys=[]))
    if "rm_scores" in batch.batch:  # a reward model scored the batch, or the agent loops scored their trajectories
        batch.batch["token_level_scores"] = batch.batch["rm_scores"]
        return _numeric_means({k: batch.non_tensor_batch[k] for k in batch.meta_info.get("reward_extra_keys", [])
                               if k in batch.non_tensor_batch})
    return apply_reward_result(batch, reward_fn(batch, return_dict=True))


def apply_reward_result(batch: DataProto, result: dict[str, Any]) -> dict[str, float]:
    """Write a reward manager's ``result`` (``reward_tensor``, ``reward_extra_info``, ``reward_metrics``) into
    ``batch``; returns the reward metrics.  Separate from the call so the call can run in the background
    (``reward_model.launch_reward_fn_async``, ``trainer/async_reward.py``)."""
    batch.batch["token_level_scores"] = result["reward_tensor"]
    errors = result.get("reward_errors")
    if errors is not None and len(errors) == len(batch):  # per sample: None, or why it could not be scored
        column = np.empty(len(batch), dtype=object)
        column[:] = list(errors)
        batch.non_tensor_batch["reward_error"] = column
    # batch-level info (e.g. error counts) comes through reward_metrics, not as columns
    extra = {k: v for k, v in result.get("reward_extra_info", {}).items() if len(v) == len(batch)}
    for key, values in extra.items():
        batch.non_tensor_batch[key] = np.asarray(list(values), dtype=object)
        batch.meta_info.setdefault("reward_extra_keys", []).append(key)
    metrics = _numeric_means(extra)
    metrics.update({key: float(value) for key, value in result.get("reward_metrics", {}).items()})
    return metrics


# ---------------------------------------------------------------------------------------------- log-probs
def compute_old_log_prob(groups: WorkerGroups, batch: DataProto, plan: StepPlan, loss_agg_mode: str) -> dict[str, float]:
    """``old_log_probs`` (pi_old of the PPO ratio, Schulman et al. 2017) and the entropy metric.

    When the step is exactly on-policy and the rollout returned the log-probs of its samples, they *are*
    pi_old and the forward pass is skipped.  With ``plan.old_log_prob_in_update`` there is no forward pass
    either: the batch is marked (``meta_info[OLD_LOG_PROBS_FROM_UPDATE]``) and the actor takes pi_old as the
    detached log-prob of its own update pass, reporting the entropy metric from that pass.
    """
    if plan.old_log_prob_in_update:
        batch.meta_info[OLD_LOG_PROBS_FROM_UPDATE] = True
        return {}
    if plan.reuse_rollout_log_probs and "rollout_log_probs" in batch.batch:
        batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        batch.meta_info[PI_OLD_DIAGNOSTICS_IN_UPDATE] = True  # entropy and probs diff from the update's first pass
        return {}
    from hybridflow.algorithms import agg_loss

    out = groups.actor_rollout.compute_log_prob(batch)
    metrics = {}
    if "entropys" in out.batch:
        entropys = out.batch.pop("entropys")
        metrics["actor/entropy"] = agg_loss(entropys, batch.batch["response_mask"], loss_agg_mode).item()
    keep = {key: out.batch[key] for key in ("old_log_probs", "sum_pi_squared") if key in out.batch}
    batch.union(DataProto.from_dict(keep))
    if "rollout_log_probs" in batch.batch:
        from hybridflow.tracking.metrics import compute_rollout_probs_diff_metrics

        metrics.update(compute_rollout_probs_diff_metrics(batch))
    return metrics


def refresh_reference(groups: WorkerGroups) -> float:
    """The reference model takes the actor's current weights (every rank copies its own shards); seconds."""
    return max(groups.ref.refresh_reference())


def compute_ref_log_prob(groups: WorkerGroups, batch: DataProto) -> None:
    out = groups.ref.compute_ref_log_prob(batch)
    batch.union(DataProto.from_dict({"ref_log_prob": out.batch["ref_log_prob"]}))


def compute_teacher_log_probs(groups: WorkerGroups, batch: DataProto) -> dict[str, float]:
    """On-policy distillation: each row's teacher scores the student's sample (``teacher_log_probs``)."""
    return groups.teachers.log_probs(batch)


def compute_values(groups: WorkerGroups, batch: DataProto) -> None:
    out = groups.critic.compute_values(batch)
    batch.union(DataProto.from_dict({"values": out.batch["values"]}))


# ---------------------------------------------------------------------------------------------- advantage
def compute_advantages(batch: DataProto, algorithm_config, plan: StepPlan, kl_ctrl,
                       estimator: str | None = None) -> tuple[DataProto, dict[str, float]]:
    """``token_level_rewards`` (scores minus the KL penalty when KL is in the reward) then advantages/returns.

    ``estimator`` replaces ``algorithm.adv_estimator`` (a recipe's own advantage, e.g. PRIME's).
    Returns the batch to continue with: PF-PPO (``algorithm.use_pf_ppo``) resamples it.
    """
    from hybridflow.algorithms import apply_kl_penalty, compute_advantage

    metrics: dict[str, float] = {}
    if plan.use_kl_in_reward:
        batch, kl_metrics = apply_kl_penalty(batch, kl_ctrl=kl_ctrl, kl_penalty=algorithm_config.kl_penalty)
        metrics.update(kl_metrics)
    else:
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch.meta_info.setdefault("global_steps", 0)
    batch = compute_advantage(
        batch,
        adv_estimator=estimator or algorithm_config.adv_estimator,
        gamma=algorithm_config.gamma,
        lam=algorithm_config.lam,
        num_repeat=plan.n,
        norm_adv_by_std_in_grpo=algorithm_config.norm_adv_by_std_in_grpo,
        config=algorithm_config,
    )
    return batch, metrics


# ---------------------------------------------------------------------------------------------- updates
def update_critic(groups: WorkerGroups, batch: DataProto) -> dict[str, float]:
    out = groups.critic.update_critic(batch)
    return reduce_metrics(out.meta_info.get("metrics", {}))


def update_actor(groups: WorkerGroups, batch: DataProto, temperature: float) -> dict[str, float]:
    batch.meta_info["temperature"] = temperature
    out = groups.actor_rollout.update_actor(batch)
    return reduce_metrics(out.meta_info.get("metrics", {}))


def sync_rollout_weights(groups: WorkerGroups) -> float | None:
    """Bring the updated actor weights to the rollout replicas; the seconds it took, or ``None`` when the
    replicas generate with the actor's own module (the colocated ``hf`` engine) and nothing moves."""
    return groups.rollout.fleet.update_weights()


def weight_sync_metrics(groups: WorkerGroups) -> dict[str, float]:
    """``weight_sync/*`` of the last weight sync (bytes sent, tensors skipped by the delta, checksum mismatches);
    empty for fleets that move nothing."""
    read = getattr(groups.rollout.fleet, "sync_metrics", None)
    return read() if callable(read) else {}


__all__ = [
    "StepPlan",
    "apply_reward_result",
    "WorkerGroups",
    "compute_advantages",
    "compute_old_log_prob",
    "compute_ref_log_prob",
    "compute_teacher_log_probs",
    "compute_reward",
    "compute_values",
    "generate",
    "generate_remax_baseline",
    "merge_generation_output",
    "prompts_from_loader",
    "refresh_reference",
    "split_generation_input",
    "sync_rollout_weights",
    "timed",
    "weight_sync_metrics",
    "update_actor",
    "update_critic",
]
