"""What every mode provides to the controller: its batches, its weight-sync policy, its schedule of validation
and checkpoints, and the part of the data position it owns.

A mode is a *batch source*: ``step(run, prompts)`` runs one trainer step -- getting its batch its own way, then
``ppo_step.train`` -- and returns the step's metrics (``None`` when the data ran out). The controller
(``trainer/controller.py``) owns the loop around it and is the same for every mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["BatchSource", "epoch_steps"]


def epoch_steps(config, steps_per_epoch: int, epochs: int) -> int:
    """``epochs`` passes over the loader, or ``trainer.total_training_steps`` when set."""
    total = steps_per_epoch * int(epochs)
    if config.trainer.total_training_steps is not None:
        total = int(config.trainer.total_training_steps)
    return total


class BatchSource:
    """The defaults of a mode (the synchronous ones'): a mode overrides what it does differently."""

    name = "sync"
    weights: Any  # the weight-sync policy (trainer/weight_sync.py)

    # ------------------------------------------------------------------ run length
    @classmethod
    def total_steps(cls, config, steps_per_epoch: int) -> int:
        """Trainer steps of the run: ``trainer.total_epochs`` passes, or ``trainer.total_training_steps``."""
        return epoch_steps(config, steps_per_epoch, config.trainer.total_epochs)

    @classmethod
    def scheduler_steps(cls, config, total: int) -> int:
        """LR-scheduler steps of a run of ``total`` trainer steps (one per update call)."""
        return int(total)

    # ------------------------------------------------------------------ lifecycle
    def start(self, run: Run, resumed: bool) -> None:
        """Before the first step (after a resume, if any)."""
        self.weights.start(run, resumed)

    def step(self, run: Run, prompts: Iterator[dict[str, Any]]) -> dict[str, float] | None:
        raise NotImplementedError

    def stop(self, run: Run) -> None:
        """When the loop ends (finished, stopped or failed): stop what runs beside training."""

    def resumed(self, run: Run) -> None:
        """After a checkpoint was loaded (the run's step counter is restored)."""

    # ------------------------------------------------------------------ schedule
    def validate_now(self, run: Run, last: bool) -> bool:
        """Every ``trainer.test_freq`` steps and after the last one."""
        freq = run.config.trainer.test_freq
        return freq > 0 and (last or run.global_steps % freq == 0)

    def save_now(self, run: Run, last: bool) -> bool:
        """Every ``trainer.save_freq`` steps and after the last one."""
        freq = run.config.trainer.save_freq
        return freq > 0 and (last or run.global_steps % freq == 0)

    # ------------------------------------------------------------------ data position
    def data_state(self, run: Run) -> dict[str, Any] | None:
        """The loader position to resume from: after the last batch *trained* on."""
        state_dict = getattr(run.train_dataloader, "state_dict", None)
        return state_dict() if callable(state_dict) else None

    def restore_data_state(self, run: Run, state: dict[str, Any]) -> None:
        """Continue the prompt stream where :meth:`data_state` left it."""
        load_state_dict = getattr(run.train_dataloader, "load_state_dict", None)
        if callable(load_state_dict):
            load_state_dict(state)
