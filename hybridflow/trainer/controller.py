"""The single controller of the HybridFlow programming model (Sheng et al. 2025): one loop for every mode.

A run is composed, never subclassed:

* a **mode** (``trainer/modes/``) -- the batch source: how a step gets its batch (synchronous generation,
  one-step-off, fully async, V1 sync / colocate_async / separate_async), with its weight-sync policy
  (``trainer/weight_sync.py``: when the rollout gets the new weights) and its schedule;
* **stage hooks** (``trainer/hooks/``) -- SPIN's DPO update, PRIME's filter and PRM, distillation's teachers;
* the **PPO step** (``trainer/ppo_step.py``) -- the stages every mode trains its batch with.

``fit`` is the loop: resume, start the mode, validate before training, then step after step -- the mode's step,
validation and checkpoints on the mode's schedule, metrics to the logger -- and stop the mode whatever happens.
The controller holds no model state (that lives in the worker groups); its own state is the step counter, the
epoch, the KL controller and the run history.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, final

from hybridflow.config.plan import StepPlan, plan_step
from hybridflow.trainer import run_checkpoint as ckpt
from hybridflow.trainer.async_reward import AsyncRewardScorer
from hybridflow.trainer.controller_checkpoint import load_run, save_run
from hybridflow.trainer.drift import DriftMonitor
from hybridflow.trainer.hooks import Hooks, hooks_for
from hybridflow.trainer.modes import BatchSource, mode_for
from hybridflow.trainer.resume_guard import check_finished, check_restored
from hybridflow.trainer.stages import WorkerGroups
from hybridflow.trainer.step_failures import StepFailedError
from hybridflow.trainer.step_log import StepLog
from hybridflow.trainer.validation import Validator

__all__ = ["RLController", "RunHistory", "build_flops_counters"]


@dataclass
class RunHistory:
    """What the run report and tests read back: metrics per step, sample generations and (async training)
    which samples each step trained on with their staleness."""

    metrics: list[dict[str, float]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    trained: list[dict[str, Any]] = field(default_factory=list)  # async training: one entry per trained sample
    abandoned: list[int] = field(default_factory=list)  # fully async: samples generated but not trained at the end
    evicted: list[dict[str, Any]] = field(default_factory=list)  # V1: groups the replay buffer evicted (why, when)


def build_flops_counters(config) -> dict:
    """One ``FlopsCounter`` per trained role for ``perf/mfu/<role>``; a model whose config cannot be read (exotic
    remote code) simply gets no MFU metric instead of stopping the run."""
    import torch
    from transformers import AutoConfig

    from hybridflow.tracking.flops import FlopsCounter

    device_name = "cpu" if config.trainer.device == "cpu" or not torch.cuda.is_available() else None
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


@final
class RLController:
    """Drives one training run (see the module docstring). ``mode``, ``hooks``, ``plan`` and
    ``total_training_steps`` are what the launch decided; left out, they are derived from ``config``."""

    def __init_subclass__(cls, **kwargs):
        raise TypeError(f"{cls.__name__}: RLController is composed, never subclassed -- a new mode is a file in "
                        "hybridflow/trainer/modes/, a new stage a hook in hybridflow/trainer/hooks/")

    def __init__(self, config, tokenizer, groups: WorkerGroups, train_dataloader, val_dataloader,
                 reward_fn: Callable, val_reward_fn: Callable, logger=None, n_devices: int = 1, dp_size: int = 1,
                 *, mode: BatchSource | None = None, hooks: Hooks | None = None, plan: StepPlan | None = None,
                 total_training_steps: int | None = None):
        from hybridflow.algorithms import get_kl_controller

        self.config = config
        self.tokenizer = tokenizer
        self.groups = groups
        self.train_dataloader = train_dataloader
        self.reward_fn = reward_fn
        self.logger = logger
        self.n_devices = n_devices
        self.dp_size = dp_size
        self.plan = plan if plan is not None else plan_step(config)
        self.mode = mode if mode is not None else mode_for(config, train_dataloader)
        self.weights = self.mode.weights
        self.hooks = hooks if hooks is not None else hooks_for(config)
        self.total_training_steps = (total_training_steps if total_training_steps is not None
                                     else self.mode.total_steps(config, len(train_dataloader)))
        self.kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl) if self.plan.use_kl_in_reward else None
        self.global_steps = 0
        self.epoch = 0
        self.skipped_steps = 0  # steps whose update was skipped for non-finite gradients
        self.tolerated_failures = float(config.trainer.tolerated_failure_fraction)
        self.history = RunHistory()
        self._error: str | None = None  # why the run stopped (a failed step), for the report
        self.flops_counters = build_flops_counters(config)
        # reward_model.launch_reward_fn_async: the reward function scores in the background during the log-prob,
        # reference and value passes (the config refuses it where scores are needed earlier)
        self.async_reward = AsyncRewardScorer(reward_fn) if config.reward_model.launch_reward_fn_async else None
        self.drift = DriftMonitor.from_config(config)  # trainer.drift: rollout vs trainer log-probs, every step
        self.validator = None
        if val_dataloader is not None:
            tcfg = config.trainer
            self.validator = Validator(groups, val_dataloader, val_reward_fn, tokenizer,
                                       config.actor_rollout_ref.rollout.val_kwargs, tcfg.log_val_generations,
                                       seed=tcfg.seed, dump_dir=tcfg.validation_data_dir)

    # ------------------------------------------------------------------------------------------ the loop
    def fit(self, should_stop: Callable[[], bool] | None = None) -> RunHistory:
        """Train until ``total_training_steps``; validation and checkpoints on the mode's schedule.

        ``should_stop`` (checked after each step) ends the run early, e.g. on a wall-clock budget; the step it
        stops after is treated as the last one (validated and saved).
        """
        tcfg = self.config.trainer
        resumed = load_run(self)
        finished = False  # the report is written for a run that ended or stopped on a failed step, not a crash
        try:
            start = check_restored(self, resumed)  # resumed to step 0 with checkpoints there: an error
            self.mode.start(self, resumed)
            validate_only = self.validator is not None and tcfg.val_before_train and tcfg.val_only
            if self.validator is not None and tcfg.val_before_train:
                self.validate()
            if not validate_only:
                ran_out, stopped = self._loop(self._prompt_stream(), should_stop)
                check_finished(self, start, ran_out, stopped)  # no data left early / a resume that trained nothing
            finished = True
        except StepFailedError as e:
            self._error, finished = str(e), True
            raise
        finally:
            self.mode.stop(self)
            ckpt.release_checkpoint_dir(tcfg.default_local_dir)
            if finished:
                self._finish()
        return self.history

    def _loop(self, prompts: Iterator[dict[str, Any]], should_stop: Callable[[], bool] | None) -> tuple[bool, bool]:
        """Step until the run's length; returns ``(the data ran out, should_stop ended it)``."""
        while self.global_steps < self.total_training_steps:
            try:
                metrics = self.mode.step(self, prompts)
            except StepFailedError as e:  # log what was counted (the report says it), then stop
                self._stopped(e)
                raise
            if metrics is None:
                return True, False  # data exhausted (total_epochs reached)
            self.global_steps += 1
            stop = should_stop is not None and should_stop()
            last = self.global_steps >= self.total_training_steps or stop
            self._after_step(metrics, last)
            if last:
                return False, stop
        return False, False

    def _after_step(self, metrics: dict[str, float], last: bool) -> None:
        """Validation and checkpoint if due (``timing_s/testing``, ``timing_s/save_checkpoint``), then the log."""
        log = StepLog(metrics=metrics)
        if self.validator is not None and self.mode.validate_now(self, last):
            with log.timed("testing"):
                metrics.update(self.validate(log=False))
        if self.mode.save_now(self, last):
            with log.timed("save_checkpoint"):
                save_run(self)
        metrics.update({f"timing_s/{k}": v for k, v in log.timing.items()})
        self.record(metrics, to_logger=last or self.global_steps % max(1, self.config.trainer.log_freq) == 0)

    def _prompt_stream(self) -> Iterator[dict[str, Any]]:
        """Prompt batches across epochs until ``trainer.total_epochs`` passes are done (or steps run out).

        The loader owns the epoch counter and its position (``data.pt``): a run stopped right after the last batch
        of an epoch resumes with the first batch of the next one instead of training zero steps (verl issue
        #7401). ``self.epoch`` mirrors the loader's epoch for logging and the trainer state.
        """
        while self._loader_epoch() < self.config.trainer.total_epochs:
            produced = False
            for batch_dict in self.train_dataloader:
                produced = True
                self.epoch = self._loader_epoch()
                if self.epoch >= self.config.trainer.total_epochs:  # a loader resumed at an epoch's end rolled over
                    return  # into one more epoch than the run has: the uninterrupted run would have stopped
                yield batch_dict
            if not produced:
                return

    def _loader_epoch(self) -> int:
        state_dict = getattr(self.train_dataloader, "state_dict", None)
        return int(state_dict()["epoch"]) if callable(state_dict) else self.epoch

    # ------------------------------------------------------------------------------------------ reporting
    def validate(self, log: bool = True) -> dict[str, float]:
        """Validate the current weights on the held-out set; ``log``: record the metrics as a row of their own."""
        start = time.perf_counter()
        result = self.validator.run(self.global_steps)
        metrics = dict(result.metrics)
        self.history.samples.extend(result.samples)
        if self.logger is not None and result.samples:
            self.logger.log_generations(result.samples, step=self.global_steps)
        if log:
            metrics["timing_s/testing"] = time.perf_counter() - start
            self.record(metrics)
        return metrics

    def record(self, metrics: dict[str, float], to_logger: bool = True) -> None:
        """Keep ``metrics`` in the run's history; send them to the logger too unless ``to_logger`` is false
        (``trainer.log_freq``: a step's metrics reach the logger every log_freq steps, and at the last step)."""
        self.history.metrics.append({"step": self.global_steps, **metrics})
        if self.logger is not None and to_logger:
            self.logger.log(data=metrics, step=self.global_steps)

    def _stopped(self, error: StepFailedError) -> None:
        """The step that failed: its failure counts go to the log under its step number and the report says why
        the run stopped (the exception then ends the run)."""
        self.global_steps += 1
        self.record({**error.metrics, "training/global_step": float(self.global_steps), "training/stopped": 1.0})

    def _finish(self) -> None:
        if self.async_reward is not None:
            self.async_reward.close()
        if self.logger is None:
            return
        output_dir = getattr(self.logger, "output_dir", None)  # loggers without a folder get no report
        if self.config.trainer.report and output_dir is not None:
            from hybridflow.tracking.report import write_report

            write_report(output_dir, self.history.metrics, self.history.samples,
                         title=f"{self.config.trainer.project_name}/{self.config.trainer.experiment_name}",
                         error=self._error)
        self.logger.finish()
