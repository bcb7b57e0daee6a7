"""The controller's modes, one file each: how batches reach the trainer and when weights move.

``config/modes.py`` maps verl's keys (``trainer.use_v1`` / ``trainer.v1.trainer_mode``, ``async_training.mode``,
``trainer.recipe``) to one mode name; :data:`MODE_CLASSES` maps the name to its batch source here. Each mode
file's docstring lists its step, and its ``step`` method reads as that list.
"""

from __future__ import annotations

from hybridflow.config.modes import MODES, run_mode
from hybridflow.trainer.modes.base import BatchSource
from hybridflow.trainer.modes.fully_async import FullyAsyncMode
from hybridflow.trainer.modes.one_step_off import OneStepOffMode
from hybridflow.trainer.modes.sync import SyncMode
from hybridflow.trainer.modes.v1_colocate_async import V1ColocateAsyncMode
from hybridflow.trainer.modes.v1_separate_async import V1SeparateAsyncMode
from hybridflow.trainer.modes.v1_sync import V1SyncMode

__all__ = ["MODE_CLASSES", "BatchSource", "mode_class", "mode_for", "run_length"]

MODE_CLASSES: dict[str, type[BatchSource]] = {
    "sync": SyncMode,
    "one_step_off": OneStepOffMode,
    "fully_async": FullyAsyncMode,
    "v1_sync": V1SyncMode,
    "v1_colocate_async": V1ColocateAsyncMode,
    "v1_separate_async": V1SeparateAsyncMode,
}
assert set(MODE_CLASSES) == set(MODES), "every mode of config/modes.py has a file here"


def mode_class(config) -> type[BatchSource]:
    """The batch-source class of the configuration's mode."""
    return MODE_CLASSES[run_mode(config)]


def mode_for(config, train_dataloader) -> BatchSource:
    """A fresh batch source for one run."""
    return mode_class(config)(config, train_dataloader)


def run_length(config, steps_per_epoch: int) -> tuple[int, int]:
    """``(trainer steps, LR-scheduler steps)`` of the run: the mode's horizon (``trainer.total_training_steps``, or
    epochs x loader length; the fully async rollouter's own epochs and prompt budget) and the update calls it
    makes. The workers' LR schedules need the second, so this runs before their models load (as in verl)."""
    if steps_per_epoch <= 0:
        raise ValueError(
            f"the training dataloader yields no batch: fewer prompts than data.train_batch_size="
            f"{config.data.train_batch_size} (or data.gen_batch_size) are left after data.filter_overlong_prompts "
            "dropped the over-long ones (the configuration check counted the files' rows); lower the batch size, "
            "raise data.max_prompt_length or add data"
        )
    cls = mode_class(config)
    total = cls.total_steps(config, steps_per_epoch)
    if total <= 0:
        raise ValueError(f"total training steps is {total}; set trainer.total_epochs or trainer.total_training_steps > 0")
    return total, cls.scheduler_steps(config, total)
