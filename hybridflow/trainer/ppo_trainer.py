"""The single controller: the PPO/GRPO training loop over worker groups (HybridFlow, Sheng et al. 2025).

One step (``train_step``) is the paper's dataflow, written as calls to the stages of ``stages.py``, each timed
into ``timing_s/<stage>``.  The loop around it (``fit``) handles epochs, validation, checkpoints and resume.
Algorithm variants are options of the stages:

* ReMax (Li et al. 2024): a greedy ``gen_max`` generation gives ``reward_baselines``;
* DAPO dynamic sampling (Yu et al. 2025): ``collect_batch`` keeps generating prompt batches until enough
  groups with reward variance are found (``dynamic_sampling.py``);
* critic warm-up: the actor is not updated during the first ``trainer.critic_warmup`` steps;
* KL in reward (Ziegler et al. 2019) with a fixed/adaptive controller whose state is checkpointed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from hybridflow.algorithms.batch_ops import ROLLOUT_CORRECTION_BYPASS
from hybridflow.algorithms.bypass_loss import BypassSettings
from hybridflow.algorithms.distillation import DISTILLATION_SETTINGS
from hybridflow.protocol import DataProto
from hybridflow.tracking.metrics import (
    compute_data_metrics,
    compute_memory_metrics,
    compute_mfu_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
)
from hybridflow.trainer import run_checkpoint as ckpt
from hybridflow.trainer import stages
from hybridflow.trainer.async_reward import AsyncRewardScorer
from hybridflow.trainer.balance import balance_batch
from hybridflow.trainer.dynamic_sampling import GroupFilterAccumulator, zero_variance_fraction
from hybridflow.trainer.rollout_correction_stage import apply_rollout_correction, correction_enabled
from hybridflow.trainer.stages import StepPlan, WorkerGroups, timed
from hybridflow.trainer.step_failures import (
    StepFailedError,
    check_failures,
    check_trained_tokens,
    reward_failures,
    tool_failures,
    trajectory_failures,
)
from hybridflow.trainer.validation import Validator


def resolve_total_training_steps(config, steps_per_epoch: int) -> int:
    """``trainer.total_training_steps`` if set, else epochs x loader length; written into the optim configs.
    Fully async training runs ``rollout.total_epochs`` passes, at most ``rollout.total_rollout_steps`` prompts
    (and at most ``trainer.total_training_steps`` steps).

    The LR schedule of every worker needs the total, so this runs before the workers are built (as verl).
    """
    if steps_per_epoch <= 0:
        raise ValueError(
            f"the training dataloader yields no batch: fewer prompts than data.train_batch_size="
            f"{config.data.train_batch_size} (or data.gen_batch_size) are left after data.filter_overlong_prompts "
            "dropped the over-long ones (the configuration check counted the files' rows); lower the batch size, "
            "raise data.max_prompt_length or add data"
        )
    tcfg = config.trainer
    if config.async_training.mode == "fully_async":  # the rollouter's horizon, in trainer steps
        total = steps_per_epoch * config.rollout.total_epochs
        if config.rollout.total_rollout_steps is not None:
            total = min(total, int(config.rollout.total_rollout_steps) // config.data.train_batch_size)
        if tcfg.total_training_steps is not None:
            total = min(total, int(tcfg.total_training_steps))
    else:
        total = steps_per_epoch * tcfg.total_epochs
        if tcfg.total_training_steps is not None:
            total = int(tcfg.total_training_steps)
    if total <= 0:
        raise ValueError(f"total training steps is {total}; set trainer.total_epochs or trainer.total_training_steps > 0")
    config.actor_rollout_ref.actor.optim.total_training_steps = lr_horizon(config, total)
    config.critic.optim.total_training_steps = lr_horizon(config, total)
    return total


def lr_horizon(config, total: int) -> int:
    """Scheduler steps of a run of ``total`` trainer steps: one per update call, and verl V1's ``separate_async``
    calls the updates once per mini-batch, ``parameter_sync_step`` times a step."""
    from hybridflow.config.v1 import v1_settings

    v1 = v1_settings(config)
    return int(total) * (v1.parameter_sync_step if v1 is not None and v1.mode == "separate_async" else 1)


def build_flops_counters(config) -> dict:
    """One ``FlopsCounter`` per trained role for ``perf/mfu/<role>``; a model whose config cannot be read
    (exotic remote code) simply gets no MFU metric instead of stopping the run."""
    import logging
    import os

    from transformers import AutoConfig

    from hybridflow.tracking.flops import FlopsCounter

    device_name = None
    if config.trainer.device == "cpu" or not torch.cuda.is_available():
        device_name = "cpu"
    roles = {"actor": config.actor_rollout_ref.model}
    if config.use_critic:
        roles["critic"] = config.critic.model
    counters = {}
    for role, model_cfg in roles.items():
        try:
            hf_config = AutoConfig.from_pretrained(os.path.expanduser(model_cfg.path),
                                                   trust_remote_code=model_cfg.trust_remote_code)
            counters[role] = FlopsCounter(hf_config, device_name)
        except (OSError, ValueError, KeyError) as e:
            logging.getLogger(__name__).warning("perf/mfu/%s not reported: %s", role, e)
    return counters


@dataclass
class RunHistory:
    """What the run report and tests read back: metrics per step, sample generations and (async training)
    which samples each step trained on with their staleness."""

    metrics: list[dict[str, float]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    trained: list[dict[str, Any]] = field(default_factory=list)  # async training: one entry per trained sample
    abandoned: list[int] = field(default_factory=list)  # fully async: samples generated but not trained at the end
    evicted: list[dict[str, Any]] = field(default_factory=list)  # V1: groups the replay buffer evicted (why, when)


class PPOTrainer:
    """Drives one training run; holds no model state itself (that lives in the worker groups).

    Recipes change stages, not the loop: ``before_advantage`` runs a stage of theirs right before the advantage
    (PRIME trains and queries its PRM there), ``advantage_estimator`` replaces ``algorithm.adv_estimator``, and
    ``trained_roles`` names worker groups besides actor and critic that checkpoints must hold.
    """

    advantage_estimator: str | None = None

    def __init__(self, config, tokenizer, groups: WorkerGroups, train_dataloader, val_dataloader,
                 reward_fn: Callable, val_reward_fn: Callable, logger=None, n_devices: int = 1, dp_size: int = 1):
        from hybridflow.algorithms import get_kl_controller

        self.config = config
        self.tokenizer = tokenizer
        self.groups = groups
        self.train_dataloader = train_dataloader
        self.val_dataloader = val_dataloader
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.logger = logger
        self.n_devices = n_devices
        self.dp_size = dp_size
        self.plan = StepPlan.from_config(config)  # the plan the config's check pipeline decided
        self.kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl) if self.plan.use_kl_in_reward else None
        self.distillation = None
        if self.plan.distillation:
            from hybridflow.trainer.teachers import distillation_settings

            self.distillation = distillation_settings(config)
        self.total_training_steps = resolve_total_training_steps(config, len(train_dataloader))
        self.global_steps = 0
        self.epoch = 0
        self.skipped_steps = 0  # steps whose update was skipped for non-finite gradients
        self.tolerated_failures = float(config.trainer.tolerated_failure_fraction)
        self.history = RunHistory()
        self.flops_counters = build_flops_counters(config)
        # reward_model.launch_reward_fn_async: the reward function scores in the background during the log-prob,
        # reference and value passes (the config refuses it where scores are needed earlier)
        self.async_reward = AsyncRewardScorer(reward_fn) if config.reward_model.launch_reward_fn_async else None
        self.validator = None
        if val_dataloader is not None:
            trainer_cfg = config.trainer
            self.validator = Validator(groups, val_dataloader, val_reward_fn, tokenizer,
                                       config.actor_rollout_ref.rollout.val_kwargs,
                                       trainer_cfg.log_val_generations, seed=trainer_cfg.seed,
                                       dump_dir=trainer_cfg.validation_data_dir)

    # ------------------------------------------------------------------------------------------ loop
    def fit(self, should_stop: Callable[[], bool] | None = None) -> RunHistory:
        """Train until ``total_training_steps``; validation and checkpoints at their frequencies.

        ``should_stop`` (checked after each step) ends the run early, e.g. on a wall-clock budget; the step
        it stops after is treated as the last one (validated and saved).
        """
        tcfg = self.config.trainer
        resumed = self.load_checkpoint()
        self.start_rollout(resumed)
        if self.validator is not None and tcfg.val_before_train:
            self._validate()
            if tcfg.val_only:
                self._finish()
                return self.history
        prompts = self._prompt_stream()
        try:
            while self.global_steps < self.total_training_steps:
                try:
                    metrics = self.train_step(prompts)
                except StepFailedError as e:  # log what was counted and say it in the report, then stop
                    self._stopped(e)
                    raise
                if metrics is None:
                    break  # data exhausted (total_epochs reached)
                self.global_steps += 1
                last = self.global_steps >= self.total_training_steps or (should_stop is not None and should_stop())
                timing: dict[str, float] = {}
                if self.validator is not None and self.validate_now(last):
                    with timed("testing", timing):
                        metrics.update(self._validate(log=False))
                if self.save_now(last):
                    with timed("save_checkpoint", timing):
                        self.save_checkpoint()
                metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
                self._log(metrics, to_logger=last or self.global_steps % max(1, self.config.trainer.log_freq) == 0)
                if last:
                    break
        finally:
            self.stop_rollout()
        self._finish()
        return self.history

    def validate_now(self, last: bool) -> bool:
        """Validate after this step? Every ``trainer.test_freq`` steps and after the last one."""
        freq = self.config.trainer.test_freq
        return freq > 0 and (last or self.global_steps % freq == 0)

    def save_now(self, last: bool) -> bool:
        """Checkpoint after this step? Every ``trainer.save_freq`` steps and after the last one."""
        freq = self.config.trainer.save_freq
        return freq > 0 and (last or self.global_steps % freq == 0)

    def stop_rollout(self) -> None:
        """When the loop ends (finished, stopped or failed): stop generation running beside training (the async
        controllers); nothing runs beside the synchronous step."""

    def start_rollout(self, resumed: bool) -> None:
        """Before the first generation: replicas with their own copy of the weights get the actor's (a resumed
        actor differs from the model path they were loaded from; the sync also forms the weight-sync group)."""
        if resumed or self.config.split_placement:
            stages.sync_rollout_weights(self.groups)

    def _finish(self, error: str | None = None) -> None:
        if self.async_reward is not None:
            self.async_reward.close()
        if self.logger is None:
            return
        output_dir = getattr(self.logger, "output_dir", None)  # loggers without a folder get no report
        if self.config.trainer.report and output_dir is not None:
            from hybridflow.tracking.report import write_report

            write_report(output_dir, self.history.metrics, self.history.samples,
                         title=f"{self.config.trainer.project_name}/{self.config.trainer.experiment_name}",
                         error=error)
        self.logger.finish()

    def _stopped(self, error: StepFailedError) -> None:
        """The step that failed: its failure counts go to the log under its step number and the report says why
        the run stopped (the exception then ends the run)."""
        self.global_steps += 1
        self._log({**error.metrics, "training/global_step": float(self.global_steps), "training/stopped": 1.0})
        self._finish(error=str(error))

    def _prompt_stream(self) -> Iterator[dict[str, Any]]:
        """Prompt batches across epochs until ``trainer.total_epochs`` passes are done (or steps run out).

        The loader owns the epoch counter and its position (``data.pt``): a run stopped right after the
        last batch of an epoch resumes with the first batch of the next one instead of training zero steps
        (verl issue #7401). ``self.epoch`` mirrors the loader's epoch for logging and the trainer state.
        """
        while self._loader_epoch() < self.config.trainer.total_epochs:
            produced = False
            for batch_dict in self.train_dataloader:
                produced = True
                self.epoch = self._loader_epoch()
                yield batch_dict
            if not produced:
                return

    def _loader_epoch(self) -> int:
        state_dict = getattr(self.train_dataloader, "state_dict", None)
        return int(state_dict()["epoch"]) if callable(state_dict) else self.epoch

    # ------------------------------------------------------------------------------------------ step
    def train_step(self, prompts: Iterator[dict[str, Any]]) -> dict[str, float] | None:
        """One PPO step on the next prompt batch(es); returns its metrics (``None`` when data ran out)."""
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        with timed("step", timing):
            batch = self.collect_batch(prompts, timing, metrics)
            if batch is None:
                return None
            batch = self.train_on_batch(batch, timing, metrics)
        self.finish_step_metrics(batch, timing, metrics)
        return metrics

    def train_on_batch(self, batch: DataProto, timing: dict[str, float], metrics: dict[str, float]) -> DataProto:
        """The stages after generation: log-probs, values, reward, advantages, updates, then the weight push.

        Returns the batch trained on (PF-PPO resamples it in the advantage stage)."""
        cfg, plan, groups = self.config, self.plan, self.groups
        check_trained_tokens(batch, metrics)  # an update on a step without a model token would do nothing
        if cfg.trainer.balance_batch:
            metrics.update(balance_batch(batch, self.dp_size))
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
        # (scores already in the batch -- a reward model or the agent loops' reward loop -- need no launch)
        pending_reward = (self.async_reward.launch(batch) if self.async_reward is not None
                          and "rm_scores" not in batch.batch else None)
        if plan.old_log_prob_in_update or plan.reuse_rollout_log_probs:  # pi_old without a forward pass:
            # the update's own pass, or the rollout's log-probs (diagnostics then come from the update)
            metrics.update(stages.compute_old_log_prob(groups, batch, plan, cfg.actor_rollout_ref.actor.loss_agg_mode))
        else:
            with timed("old_log_prob", timing):
                metrics.update(stages.compute_old_log_prob(groups, batch, plan,
                                                           cfg.actor_rollout_ref.actor.loss_agg_mode))
        if plan.use_ref:
            self.refresh_reference_if_due(timing)
            with timed("ref", timing):
                stages.compute_ref_log_prob(groups, batch)
        if plan.distillation:
            with timed("teacher", timing):
                metrics.update(stages.compute_teacher_log_probs(groups, batch))
            batch.meta_info[DISTILLATION_SETTINGS] = self.distillation
        if plan.use_critic:
            with timed("values", timing):
                stages.compute_values(groups, batch)
        if pending_reward is not None:  # wait for the background scorer (the time blocked is timing_s/reward)
            with timed("reward", timing):
                metrics.update(stages.apply_reward_result(batch, self.async_reward.collect(pending_reward)))
            self.check_rewards(batch, metrics)
        if not plan.filter_groups:  # (with filtering, the accumulator reports it over every generated group)
            # groups whose n scores are all equal give GRPO-style estimators no signal (DAPO, Yu et al. 2025)
            metrics["train/zero_variance_group_fraction"] = zero_variance_fraction(batch, "seq_reward")
        self.before_advantage(batch, timing, metrics)
        with timed("adv", timing):
            batch, adv_metrics = stages.compute_advantages(batch, cfg.algorithm, plan, self.kl_ctrl,
                                                           estimator=self.advantage_estimator)
            metrics.update(adv_metrics)
        if correction_enabled(cfg.algorithm.rollout_correction):  # actor pi_old vs the rollout's mu
            metrics.update(apply_rollout_correction(batch, cfg.algorithm.rollout_correction))
        if plan.use_critic:
            with timed("update_critic", timing):
                metrics.update(stages.update_critic(groups, batch))
        if cfg.algorithm.rollout_correction.bypass_mode:  # old_log_probs are mu; the actor's loss corrects
            batch.meta_info[ROLLOUT_CORRECTION_BYPASS] = BypassSettings.from_config(cfg.algorithm.rollout_correction)
        if self.global_steps >= plan.critic_warmup:  # the first critic_warmup steps train the critic only
            with timed("update_actor", timing):
                metrics.update(stages.update_actor(groups, batch, cfg.actor_rollout_ref.rollout.temperature))
            self.push_weights(timing, metrics)
        return batch

    def before_advantage(self, batch: DataProto, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """A recipe's stage between the log-prob / value passes and the advantage (nothing in PPO)."""

    def trained_roles(self) -> dict[str, object]:
        """Worker groups besides actor and critic whose training state checkpoints hold (``{component: group}``)."""
        return {}

    def refresh_reference_if_due(self, timing: dict[str, float]) -> None:
        """``trainer.ref_update_freq``: before this step's reference log-probs, the reference becomes the actor
        that sampled the batch (``timing_s/update_ref``)."""
        if self.plan.refresh_reference_at(self.global_steps + 1):
            with timed("update_ref", timing):
                stages.refresh_reference(self.groups)

    def push_weights(self, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """After an actor update: bring the new weights to the rollout (``timing_s/update_weights`` when
        something moves; the colocated hf engine shares the actor's module and moves nothing).  The async
        controllers push at other moments and override this."""
        moved = stages.sync_rollout_weights(self.groups)
        if moved is not None:
            timing["update_weights"] = moved
            metrics.update(stages.weight_sync_metrics(self.groups))

    def finish_step_metrics(self, batch: DataProto, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """verl's data / timing / throughput metrics of the step just trained, the rollout dump, counters."""
        cfg = self.config
        if cfg.trainer.rollout_data_dir:
            from hybridflow.trainer.rollout_dump import dump_generations

            extra = {k: list(batch.non_tensor_batch[k]) for k in self._reward_extra_keys(batch)}
            dump_generations(cfg.trainer.rollout_data_dir, self.global_steps + 1, self.tokenizer, batch,
                             batch.batch["token_level_scores"].sum(-1).tolist(), extra)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        metrics.update(compute_data_metrics(batch, use_critic=self.plan.use_critic, eos_token_ids=[eos]))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing, self.n_devices))
        metrics.update(compute_mfu_metrics(batch, timing, self.flops_counters, self.n_devices,
                                           cfg.actor_rollout_ref.actor.ppo_epochs))
        metrics.update(compute_memory_metrics())
        if metrics.get("actor/nonfinite_grad_skipped", 0.0) > 0:
            self.skipped_steps += 1
        metrics["training/skipped_steps"] = float(self.skipped_steps)
        metrics["training/global_step"] = float(self.global_steps + 1)
        metrics["training/epoch"] = float(self.epoch)

    @staticmethod
    def _reward_extra_keys(batch: DataProto) -> list[str]:
        return [k for k in batch.meta_info.get("reward_extra_keys", []) if k in batch.non_tensor_batch]

    def collect_batch(self, prompts: Iterator[dict[str, Any]], timing: dict[str, float],
                      metrics: dict[str, float], step: int | None = None) -> DataProto | None:
        """Generate and score the batch of step ``step`` (default: the next one); with DAPO filtering, as many
        rounds as needed."""
        plan = self.plan
        fg = self.config.algorithm.filter_groups
        acc = None
        if plan.filter_groups:
            acc = GroupFilterAccumulator(target_prompts=self.config.data.train_batch_size, n=plan.n,
                                         metric=fg.metric or "seq_reward", max_num_gen_batches=fg.max_num_gen_batches)
        while True:
            batch_dict = next(prompts, None)
            if batch_dict is None:
                return None
            batch = self.generate_and_score(stages.prompts_from_loader(batch_dict), timing, metrics, step)
            if acc is None:
                return batch
            acc.add(batch)
            if acc.full:
                metrics.update(acc.metrics())
                return acc.take()
            acc.check_budget()

    def generate_and_score(self, prompts: DataProto, timing: dict[str, float], metrics: dict[str, float],
                           step: int | None = None) -> DataProto:
        plan = self.plan
        rollout_cfg = self.config.actor_rollout_ref.rollout
        step = self.global_steps + 1 if step is None else int(step)  # the sampling seeds derive from it
        meta = {"do_sample": bool(rollout_cfg.do_sample), "validate": False, "global_steps": step}
        prompts.meta_info["global_steps"] = step
        with timed("gen", timing):
            if plan.remax_baseline:
                baseline_prompts = prompts.select(deepcopy=True)
            batch = stages.generate(self.groups, prompts, meta)
        gen_metrics = batch.meta_info.pop("gen_metrics", {})
        metrics.update(gen_metrics)
        timing.update(batch.meta_info.pop("gen_timing", {}))  # verl's agent_loop/* timings
        self.check_generation(batch, gen_metrics, metrics)
        if plan.remax_baseline:
            with timed("gen_max", timing):
                baselines = stages.generate_remax_baseline(self.groups, baseline_prompts, self.reward_fn)
            batch.batch["reward_baselines"] = baselines.repeat_interleave(len(batch) // len(baselines))
        if self.async_reward is None or "rm_scores" in batch.batch:  # else scored in the background (train_step)
            with timed("reward", timing):
                metrics.update(stages.compute_reward(self.groups, batch, self.reward_fn, plan.use_rm))
            self.check_rewards(batch, metrics)
        return batch

    # ------------------------------------------------------------------ failure accounting (step_failures.py)
    def check_generation(self, batch: DataProto, gen_metrics: dict[str, float], metrics: dict[str, float]) -> None:
        """``rollout/failed_fraction`` and ``rollout/tool_crash_fraction`` of a generated batch; stops the run
        when too many trajectories or tool calls failed."""
        check_failures([trajectory_failures(batch), tool_failures(gen_metrics, len(batch))],
                       self.tolerated_failures, metrics)

    def check_rewards(self, batch: DataProto, metrics: dict[str, float]) -> None:
        """``reward/error_fraction`` of a scored batch; stops the run when too many samples could not be scored."""
        check_failures([reward_failures(batch)], self.tolerated_failures, metrics)

    # ------------------------------------------------------------------------------------------ validation
    def _validate(self, log: bool = True) -> dict[str, float]:
        start = time.perf_counter()
        result = self.validator.run(self.global_steps)
        metrics = dict(result.metrics)
        self.history.samples.extend(result.samples)
        if self.logger is not None and result.samples:
            self.logger.log_generations(result.samples, step=self.global_steps)
        if log:
            metrics["timing_s/testing"] = time.perf_counter() - start
            self._log(metrics)
        return metrics

    def _log(self, metrics: dict[str, float], to_logger: bool = True) -> None:
        """Record ``metrics`` in the run's history; send them to the logger too unless ``to_logger`` is false
        (``trainer.log_freq``: a step's metrics reach the logger every log_freq steps, and at the last step)."""
        self.history.metrics.append({"step": self.global_steps, **metrics})
        if self.logger is not None and to_logger:
            self.logger.log(data=metrics, step=self.global_steps)

    # ------------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        """Atomic ``global_step_N`` (actor, critic, data.pt, trainer state), then keep-last-K rotation."""
        tcfg = self.config.trainer
        root = tcfg.default_local_dir
        with ckpt.CheckpointWriter(root, self.global_steps) as writer:
            components = ["actor"]
            self.groups.actor_rollout.save_checkpoint(str(writer.tmp_dir / "actor"), self.global_steps, None)
            if self.plan.use_critic:
                self.groups.critic.save_checkpoint(str(writer.tmp_dir / "critic"), self.global_steps, None)
                components.append("critic")
            for name, group in self.trained_roles().items():
                group.save_checkpoint(str(writer.tmp_dir / name), self.global_steps, None)
                components.append(name)
            data_state = self.data_state()
            if data_state is not None:
                writer.save_data_state(data_state)
            writer.save_trainer_state(ckpt.TrainerState(
                global_step=self.global_steps,
                epoch=self.epoch,
                rng=ckpt.capture_rng_state(),
                kl_ctrl=self.kl_ctrl.state_dict() if self.kl_ctrl is not None else {},
            ))
            writer.commit(components, metadata=ckpt.lora_metadata(self.config.actor_rollout_ref.model))
        ckpt.rotate_checkpoints(root, "actor", tcfg.max_actor_ckpt_to_keep)
        ckpt.rotate_checkpoints(root, "critic", tcfg.max_critic_ckpt_to_keep)

    def data_state(self) -> dict[str, Any] | None:
        """The loader position to resume from: after the last batch *trained* on (the async controllers fetch
        prompts ahead of training and override this)."""
        state_dict = getattr(self.train_dataloader, "state_dict", None)
        return state_dict() if callable(state_dict) else None

    def load_checkpoint(self) -> bool:
        """Restore everything from the folder ``trainer.resume_mode`` selects; False on a fresh start."""
        tcfg = self.config.trainer
        ckpt.clean_stale_temp_dirs(tcfg.default_local_dir)
        folder = ckpt.find_resume_dir(tcfg.default_local_dir, tcfg.resume_mode, tcfg.resume_from_path)
        ckpt.check_overwrite(tcfg.default_local_dir, folder, saves=tcfg.save_freq > 0,
                             allowed=tcfg.overwrite_checkpoints)
        if folder is None:
            return False
        manifest = ckpt.read_manifest(folder)
        if self.plan.use_critic and "critic" not in manifest["components"]:
            raise ckpt.CheckpointError(
                f"{folder} has no critic checkpoint but this run uses a critic; resume from a PPO checkpoint "
                "or set trainer.resume_mode=disable"
            )
        self.groups.actor_rollout.load_checkpoint(str(folder / "actor"))
        if self.plan.use_critic:
            self.groups.critic.load_checkpoint(str(folder / "critic"))
        for name, group in self.trained_roles().items():
            if name not in manifest["components"]:
                raise ckpt.CheckpointError(f"{folder} has no {name} checkpoint but this run trains it; resume from a "
                                           "checkpoint of the same recipe or set trainer.resume_mode=disable")
            group.load_checkpoint(str(folder / name))
        state = ckpt.load_trainer_state(folder)
        self.global_steps, self.epoch = state.global_step, state.epoch
        ckpt.restore_rng_state(state.rng)
        if self.kl_ctrl is not None and state.kl_ctrl:
            self.kl_ctrl.load_state_dict(state.kl_ctrl)
        data_state = ckpt.load_data_state(folder)
        if data_state is not None:
            self.restore_data_state(data_state)
        return True

    def restore_data_state(self, state: dict[str, Any]) -> None:
        """Continue the prompt stream where :meth:`data_state` left it."""
        load_state_dict = getattr(self.train_dataloader, "load_state_dict", None)
        if callable(load_state_dict):
            load_state_dict(state)


__all__ = ["PPOTrainer", "RunHistory", "lr_horizon", "resolve_total_training_steps"]
