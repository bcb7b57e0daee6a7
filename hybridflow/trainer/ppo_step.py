"""The PPO/GRPO step of the HybridFlow paper (Sheng et al. 2025, §3, Fig. 4), as the controller runs it.

Every mode (``trainer/modes/``) gets its batch its own way, then trains it with :func:`train`::

    generate_and_score  prompts -> rollout -> (ReMax greedy baseline) -> reward
    collect             generate_and_score, round after round while DAPO's group filter needs more groups
    train               old log-prob (or none: pi_old from the rollout or the update) -> reference -> the drift
                        check (trainer/drift.py) -> hooks'
                        extra scores (distillation teachers) -> values -> (background reward) -> hooks
                        (PRIME's PRM) -> advantage -> rollout correction -> update critic -> update actor ->
                        the mode's weight-sync policy
    step_metrics        verl's data / timing / throughput / MFU / memory metrics of the step

Each function takes the controller (``run``: config, plan, worker groups, hooks, weight sync) and the step's
:class:`~hybridflow.trainer.step_log.StepLog`; the stages themselves are ``trainer/stages.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from hybridflow.algorithms.batch_ops import ROLLOUT_CORRECTION_BYPASS
from hybridflow.algorithms.bypass_loss import BypassSettings
from hybridflow.protocol import DataProto
from hybridflow.tracking.metrics import (
    compute_data_metrics,
    compute_memory_metrics,
    compute_mfu_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
)
from hybridflow.trainer import stages
from hybridflow.trainer.asynchronous.staleness import tag_versions
from hybridflow.trainer.balance import balance_batch
from hybridflow.trainer.dynamic_sampling import GroupFilterAccumulator, zero_variance_fraction
from hybridflow.trainer.rollout_correction_stage import apply_rollout_correction, correction_enabled
from hybridflow.trainer.step_failures import (
    check_failures,
    check_trained_tokens,
    reward_failures,
    tool_failures,
    trajectory_failures,
)
from hybridflow.trainer.step_log import StepLog
from hybridflow.trainer.weight_sync import PushAfterUpdate

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["check_generation", "check_rewards", "collect", "generate_and_score", "score", "step_metrics", "train"]


# ---------------------------------------------------------------------------------------------- the batch
def collect(run: Run, prompts: Iterator[dict[str, Any]], log: StepLog,
            step: int | None = None) -> DataProto | None:
    """Generate and score the batch of step ``step`` (default: the next one); with DAPO's group filter
    (``algorithm.filter_groups``), as many rounds as it takes to fill the batch. ``None``: the data ran out."""
    fg = run.config.algorithm.filter_groups
    acc = None
    if run.plan.filter_groups:
        acc = GroupFilterAccumulator(target_prompts=run.config.data.train_batch_size, n=run.plan.n,
                                     metric=fg.metric or "seq_reward", max_num_gen_batches=fg.max_num_gen_batches)
    while True:
        batch_dict = next(prompts, None)
        if batch_dict is None:
            return None
        batch = generate_and_score(run, stages.prompts_from_loader(batch_dict), log, step)
        if acc is None:
            return batch
        acc.add(batch)
        if acc.full:
            log.update(acc.metrics())
            return acc.take()
        acc.check_budget()


def generate_and_score(run: Run, prompts: DataProto, log: StepLog, step: int | None = None) -> DataProto:
    """Sample ``rollout.n`` responses per prompt (seeds derived from ``step``), the ReMax greedy baseline, then the
    reward (unless it is scored in the background during the log-prob passes); the hooks see the scored batch."""
    plan = run.plan
    rollout_cfg = run.config.actor_rollout_ref.rollout
    step = run.global_steps + 1 if step is None else int(step)
    meta = {"do_sample": bool(rollout_cfg.do_sample), "validate": False, "global_steps": step}
    prompts.meta_info["global_steps"] = step
    with log.timed("gen"):
        if plan.remax_baseline:
            baseline_prompts = prompts.select(deepcopy=True)
        batch = stages.generate(run.groups, prompts, meta)
    gen_metrics = batch.meta_info.pop("gen_metrics", {})
    log.update(gen_metrics)
    log.timing.update(batch.meta_info.pop("gen_timing", {}))  # verl's agent_loop/* timings
    check_generation(run, batch, gen_metrics, log)
    version = getattr(run.weights, "version", None)
    if isinstance(run.weights, PushAfterUpdate) and version is not None:  # synchronous: every token of this version
        tag_versions(batch, version, version)
        log.metrics["weights/version"] = float(version)
    if plan.remax_baseline:
        with log.timed("gen_max"):
            baselines = stages.generate_remax_baseline(run.groups, baseline_prompts, run.reward_fn)
        batch.batch["reward_baselines"] = baselines.repeat_interleave(len(batch) // len(baselines))
    if run.async_reward is None or "rm_scores" in batch.batch:  # else scored in the background (train)
        score(run, batch, log)
    return run.hooks.after_scoring(run, batch, log)


def score(run: Run, batch: DataProto, log: StepLog) -> None:
    """``token_level_scores`` by the reward model or the reward function (``timing_s/reward``), failures counted."""
    with log.timed("reward"):
        log.update(stages.compute_reward(run.groups, batch, run.reward_fn, run.plan.use_rm))
    check_rewards(run, batch, log)


def check_generation(run: Run, batch: DataProto, gen_metrics: dict[str, float], log: StepLog) -> None:
    """``rollout/failed_fraction`` and ``rollout/tool_crash_fraction``; too many failures stop the run."""
    check_failures([trajectory_failures(batch), tool_failures(gen_metrics, len(batch))], run.tolerated_failures,
                   log.metrics)


def check_rewards(run: Run, batch: DataProto, log: StepLog) -> None:
    """``reward/error_fraction`` of a scored batch; too many unscored samples stop the run."""
    check_failures([reward_failures(batch)], run.tolerated_failures, log.metrics)


# ---------------------------------------------------------------------------------------------- training
def train(run: Run, batch: DataProto, log: StepLog) -> DataProto:
    """The stages after generation (see the module docstring); returns the batch trained on (PF-PPO resamples
    it in the advantage stage). A hook that trains differently (SPIN's DPO update) replaces them."""
    replaced = run.hooks.train(run, batch, log)
    if replaced is not None:
        return replaced
    cfg, plan, groups = run.config, run.plan, run.groups
    check_trained_tokens(batch, log.metrics)  # an update on a step without a model token would do nothing
    if cfg.trainer.balance_batch:
        log.update(balance_batch(batch, run.dp_size))
    batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
    # (scores already in the batch -- a reward model or the agent loops' reward loop -- need no launch)
    pending_reward = (run.async_reward.launch(batch) if run.async_reward is not None
                      and "rm_scores" not in batch.batch else None)
    _old_log_prob(run, batch, log)
    if plan.use_ref:
        refresh_reference_if_due(run, log)
        with log.timed("ref"):
            stages.compute_ref_log_prob(groups, batch)
    if run.drift is not None:  # rollout vs trainer log-probs (trainer/drift.py): flag, name, stop -- before the update
        run.drift.check(run, batch, log)
    run.hooks.after_log_probs(run, batch, log)
    if plan.use_critic:
        with log.timed("values"):
            stages.compute_values(groups, batch)
    if pending_reward is not None:  # wait for the background scorer (the time blocked is timing_s/reward)
        with log.timed("reward"):
            log.update(stages.apply_reward_result(batch, run.async_reward.collect(pending_reward)))
        check_rewards(run, batch, log)
    if not plan.filter_groups:  # (with filtering, the accumulator reports it over every generated group)
        # groups whose n scores are all equal give GRPO-style estimators no signal (DAPO, Yu et al. 2025)
        log.metrics["train/zero_variance_group_fraction"] = zero_variance_fraction(batch, "seq_reward")
    run.hooks.before_advantage(run, batch, log)
    batch = _advantage(run, batch, log)
    _updates(run, batch, log)
    return batch


def _old_log_prob(run: Run, batch: DataProto, log: StepLog) -> None:
    """pi_old: the actor's forward pass (``timing_s/old_log_prob``), or no pass at all when the update's own pass
    or the rollout's log-probs provide it (the plan decides; diagnostics then come from the update)."""
    plan, agg = run.plan, run.config.actor_rollout_ref.actor.loss_agg_mode
    if plan.old_log_prob_in_update or plan.reuse_rollout_log_probs:
        log.update(stages.compute_old_log_prob(run.groups, batch, plan, agg))
        return
    with log.timed("old_log_prob"):
        log.update(stages.compute_old_log_prob(run.groups, batch, plan, agg))


def _advantage(run: Run, batch: DataProto, log: StepLog) -> DataProto:
    cfg = run.config
    with log.timed("adv"):
        batch, adv_metrics = stages.compute_advantages(batch, cfg.algorithm, run.plan, run.kl_ctrl,
                                                       estimator=run.hooks.advantage_estimator)
        log.update(adv_metrics)
    if correction_enabled(cfg.algorithm.rollout_correction):  # actor pi_old vs the rollout's mu
        log.update(apply_rollout_correction(batch, cfg.algorithm.rollout_correction))
    return batch


def _updates(run: Run, batch: DataProto, log: StepLog) -> None:
    """Critic, then actor (after ``trainer.critic_warmup`` critic-only steps), then the mode's weight sync."""
    cfg = run.config
    if run.plan.use_critic:
        with log.timed("update_critic"):
            log.update(stages.update_critic(run.groups, batch))
    if cfg.algorithm.rollout_correction.bypass_mode:  # old_log_probs are mu; the actor's loss corrects
        batch.meta_info[ROLLOUT_CORRECTION_BYPASS] = BypassSettings.from_config(cfg.algorithm.rollout_correction)
    if run.global_steps >= run.plan.critic_warmup:
        with log.timed("update_actor"):
            log.update(stages.update_actor(run.groups, batch, cfg.actor_rollout_ref.rollout.temperature))
        run.weights.after_update(run, log)


def refresh_reference_if_due(run: Run, log: StepLog) -> None:
    """``trainer.ref_update_freq``: before this step's reference log-probs, the reference becomes the actor that
    sampled the batch (``timing_s/update_ref``)."""
    if run.plan.refresh_reference_at(run.global_steps + 1):
        with log.timed("update_ref"):
            stages.refresh_reference(run.groups)


# ---------------------------------------------------------------------------------------------- metrics
def step_metrics(run: Run, batch: DataProto, log: StepLog) -> None:
    """verl's data / timing / throughput / MFU / memory metrics of the step just trained, the rollout dump, the
    skipped-step counter."""
    cfg = run.config
    if cfg.trainer.rollout_data_dir:
        from hybridflow.trainer.rollout_dump import dump_generations

        extra = {k: list(batch.non_tensor_batch[k]) for k in batch.meta_info.get("reward_extra_keys", [])
                 if k in batch.non_tensor_batch}
        dump_generations(cfg.trainer.rollout_data_dir, run.global_steps + 1, run.tokenizer, batch,
                         batch.batch["token_level_scores"].sum(-1).tolist(), extra)
    run.hooks.before_step_metrics(batch, log)
    metrics, timing = log.metrics, log.timing
    eos = getattr(run.tokenizer, "eos_token_id", None)
    metrics.update(compute_data_metrics(batch, use_critic=run.plan.use_critic, eos_token_ids=[eos]))
    metrics.update(compute_timing_metrics(batch, timing))
    metrics.update(compute_throughput_metrics(batch, timing, run.n_devices))
    metrics.update(compute_mfu_metrics(batch, timing, run.flops_counters, run.n_devices,
                                       cfg.actor_rollout_ref.actor.ppo_epochs))
    metrics.update(compute_memory_metrics())
    run.hooks.after_step_metrics(metrics)
    if metrics.get("actor/nonfinite_grad_skipped", 0.0) > 0:
        run.skipped_steps += 1
    metrics["training/skipped_steps"] = float(run.skipped_steps)
    metrics["training/global_step"] = float(run.global_steps + 1)
    metrics["training/epoch"] = float(run.epoch)
