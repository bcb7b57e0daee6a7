"""The stages of one PPO/GRPO step, each a small function over a ``DataProto`` (HybridFlow, Sheng et al. 2025).

The step is the dataflow of the HybridFlow paper (§3, Fig. 4): generate -> reward -> old log-prob -> ref ->
values -> advantage -> update critic -> update actor -> weight sync.  Each stage reads the batch keys of the
contract in ``docs/architecture.md`` and adds its own; worker calls go through worker groups whose methods
dispatch over data-parallel ranks.  The trainer (``ppo_trainer.py``) times and orders them; variants such as
ReMax's greedy baseline or DAPO's group filtering are options here, not copies of the loop.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

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


@dataclass(frozen=True)
class StepPlan:
    """Which stages this configuration needs; decided once from the config, read by every step.

    Old log-probs (pi_old of the PPO ratio, Schulman et al. 2017, eq. 7) come from one of three places:

    * ``reuse_rollout_log_probs``: the rollout's own log-probs (``rollout.calculate_log_probs=true``) when the
      update is exactly on-policy (one optimiser step on the batch) or ``rollout_correction.bypass_mode`` asks
      for them explicitly -- never for ``optimal_token_baseline``, whose advantages need the actor pass's
      ``sum_pi_squared``; ``actor/entropy`` and ``training/rollout_probs_diff_*`` then come from the update's
      first forward pass (``PI_OLD_DIAGNOSTICS_IN_UPDATE``);
    * ``old_log_prob_in_update`` (the default for GRPO-style runs): the update is one optimiser step over
      the whole batch -- ``actor.ppo_epochs == 1`` and ``actor.ppo_mini_batch_size >= data.train_batch_size``
      -- and nothing reads ``old_log_probs`` before it: ``algorithm.use_kl_in_reward=false``, rollout
      correction off (``rollout_correction.rollout_is``/``rollout_rs`` unset, ``bypass_mode=false``), no
      ``optimal_token_baseline`` (its advantages read pi_old and ``sum_pi_squared``) and the
      rollout log-probs not reused (``rollout.calculate_log_probs=false``, so no ``training/rollout_probs_diff``
      has to be measured against them).  Then pi_old *is* the policy being differentiated, its log-prob is
      ``log_prob.detach()`` of the update's own forward pass (ratio 1, and the clipped objective's gradient is
      the plain policy gradient A * grad log pi -- what TRL does for ``num_iterations=1``), so the separate
      ``old_log_prob`` forward pass is skipped and the update reports ``actor/entropy`` instead;
    * otherwise the actor's ``compute_log_prob`` forward pass (the ``old_log_prob`` stage).

    Async training (``async_training.mode`` one_step_off / fully_async) trains on batches sampled by older
    weights, so the rollout's log-probs are pi_old only when asked for explicitly: ``bypass_mode``, or fully
    async ``use_rollout_log_probs`` without ``compute_prox_log_prob`` (verl's default there).  Taking pi_old
    from the update's own pass stays exact: it *is* the recomputation with the current weights.
    """

    n: int
    use_critic: bool
    use_ref: bool
    use_rm: bool
    use_kl_in_reward: bool
    reuse_rollout_log_probs: bool
    old_log_prob_in_update: bool
    remax_baseline: bool
    filter_groups: bool
    critic_warmup: int
    ref_update_freq: int = -1  # > 0: the reference takes the actor's weights at steps k, 2k, ... (1-based)
    distillation: bool = False  # teachers score the samples; the actor adds the distillation term

    @classmethod
    def from_config(cls, config) -> "StepPlan":
        arr = config.actor_rollout_ref
        actor, rollout = arr.actor, arr.rollout
        one_mini_batch = actor.ppo_mini_batch_size >= config.data.train_batch_size and actor.ppo_epochs == 1
        rc = config.algorithm.rollout_correction
        at = config.async_training
        on_policy = at.mode == "sync"
        # Fully async default (verl): pi_old = the rollout's log-probs, as bypass_mode asks explicitly.
        bypass = bool(rc.bypass_mode) or (
            at.mode == "fully_async" and at.use_rollout_log_probs and not at.compute_prox_log_prob)
        # IS weights / rejection compare the actor's pi_old with the rollout's mu: pi_old must be recomputed.
        corrects = rc.rollout_is is not None or rc.rollout_rs is not None
        rollout_correction = corrects or bypass
        # Exactly on-policy (one optimiser step on the batch the rollout sampled from), and the rollout was
        # asked for the log-probs of its samples: the actor's recomputation would give the same numbers.
        # Optimal Token Baseline reads pi_old and sum_pi_squared (which only the actor's pass emits) in the
        # advantage stage, before the update: the rollout's log-probs cannot stand in for that pass.
        otb = config.algorithm.adv_estimator == "optimal_token_baseline" or bool(actor.calculate_sum_pi_squared)
        reuse = bool(rollout.calculate_log_probs) and not otb and (
            (one_mini_batch and not corrects and on_policy) or bypass)
        in_update = (
            one_mini_batch and not reuse and not rollout_correction and not otb
            and not bool(config.algorithm.use_kl_in_reward)
        )
        remax = config.algorithm.adv_estimator == "remax"
        vk = rollout.val_kwargs
        if remax and (vk.do_sample and vk.temperature > 0):
            raise ValueError(
                "algorithm.adv_estimator=remax draws its greedy baseline with actor_rollout_ref.rollout.val_kwargs, "
                f"which sample (do_sample={vk.do_sample}, temperature={vk.temperature}); set "
                "actor_rollout_ref.rollout.val_kwargs.do_sample=false"
            )
        return cls(
            n=int(rollout.n),
            use_critic=bool(config.use_critic),
            use_ref=bool(config.use_reference_policy),
            # a reward-model worker scores the batch -- not PRIME's PRM (its own stage) nor a judge (asked by the
            # reward functions)
            use_rm=bool(config.reward_model.enable) and config.trainer.recipe != "prime" and not config.uses_judge,
            use_kl_in_reward=bool(config.algorithm.use_kl_in_reward),
            reuse_rollout_log_probs=reuse,
            old_log_prob_in_update=in_update,
            remax_baseline=remax,
            filter_groups=bool(config.algorithm.filter_groups.enable),
            critic_warmup=int(config.trainer.critic_warmup),
            ref_update_freq=int(config.trainer.ref_update_freq),
            distillation=bool(config.distillation.enabled),
        )

    def refresh_reference_at(self, step: int) -> bool:
        """Whether the reference takes the actor's weights before step ``step`` (1-based) is scored: every
        ``trainer.ref_update_freq`` steps, at the start of the step (verl-recipe's SPIN)."""
        return self.use_ref and self.ref_update_freq > 0 and step % self.ref_update_freq == 0


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
    "update_actor",
    "update_critic",
]
