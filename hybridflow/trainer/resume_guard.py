"""A run that does nothing is an error: the three ways a run (most often a resumed one) can exit 0 without training.

verl #7401 (fixed in verl PR #7974; the same in VeOmni and prime-rl): a resumed run found its loader at the end of
an epoch, trained zero steps and exited 0 with healthy-looking logs.  The controller asks this module at two points:

* after the restore (:func:`check_restored`) -- ``trainer.resume_mode`` is ``auto`` or ``resume_path``, complete
  checkpoints exist, yet the run starts from step 0 (a checkpoint whose trainer state says step 0, a restore that
  did not take);
* after the loop (:func:`check_finished`) -- the prompt stream ran out before ``total_training_steps`` (the
  loader was exhausted early: a resumed loader positioned past its data, ``trainer.total_training_steps`` beyond
  ``trainer.total_epochs`` passes), or a resumed run trained zero steps while steps remained.

Each raises :class:`RunDidNothingError` (a ``CheckpointError``: the CLI prints it as one line, exit 2) naming the
numbers and the fix.  A run stopped on purpose (``should_stop``: Ctrl-C, a wall-clock budget) is not judged, and
neither is DAPO's group filter running out of prompts (its rounds take more than one batch per step by design: the
run ends early with a warning).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybridflow.trainer.run_checkpoint import CheckpointError, completed_steps

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["RunDidNothingError", "RunStart", "check_finished", "check_restored"]

_LOG = logging.getLogger(__name__)


class RunDidNothingError(CheckpointError):
    """A run (usually a resumed one) would exit without training what it was asked to (see the module docstring)."""


@dataclass(frozen=True)
class RunStart:
    """Where the loop started: the step the run resumed at (0 on a fresh start) and whether it resumed."""

    step: int
    resumed: bool


def check_restored(run: Run, resumed: bool) -> RunStart:
    """After ``load_run``: a run told to resume, with complete checkpoints in its folder, must not start at 0."""
    tcfg = run.config.trainer
    steps = completed_steps(tcfg.default_local_dir)
    told = (tcfg.resume_mode == "resume_path" and resumed) or (tcfg.resume_mode == "auto" and any(s > 0 for s in steps))
    if run.global_steps == 0 and told:
        where = tcfg.resume_from_path if tcfg.resume_mode == "resume_path" else tcfg.default_local_dir
        raise RunDidNothingError(
            f"trainer.resume_mode={tcfg.resume_mode} with checkpoints (steps {steps[-3:]} in "
            f"{tcfg.default_local_dir}), yet the run would start from step 0 ({where} restored no training state): "
            "resume from a complete global_step_N (trainer.resume_from_path) or start over explicitly with "
            "trainer.resume_mode=disable in a new trainer.default_local_dir")
    return RunStart(step=int(run.global_steps), resumed=bool(resumed))


def check_finished(run: Run, start: RunStart, data_ran_out: bool, stopped: bool) -> None:
    """After the loop: the data must not run out before ``total_training_steps``, and a resumed run with steps
    left must train at least one (``stopped``: ended on purpose by ``should_stop`` -- not judged)."""
    total, done = int(run.total_training_steps), int(run.global_steps)
    if stopped or done >= total:
        return
    tcfg = run.config.trainer
    trained = done - start.step
    if data_ran_out and run.plan.filter_groups:
        _LOG.warning("the prompts ran out at step %d of %d: DAPO's group filter (algorithm.filter_groups) used more "
                     "than one batch per step; raise trainer.total_epochs to train all %d steps", done, total, total)
        return
    what = ("the resumed run trained no step" if start.resumed and trained == 0
            else f"the run trained {trained} step(s)")
    if data_ran_out:
        raise RunDidNothingError(
            f"the training data ran out at step {done} of trainer.total_training_steps={total}: {what} "
            f"(started at step {start.step}, loader epoch {run.epoch} of trainer.total_epochs={tcfg.total_epochs}); "
            "raise trainer.total_epochs, or lower trainer.total_training_steps to the steps the data holds")
    if start.resumed and trained == 0:
        raise RunDidNothingError(
            f"{what} although {total - done} of trainer.total_training_steps={total} remain (resumed at step "
            f"{start.step} from {tcfg.default_local_dir}); check the checkpoint's data position (data.pt) and "
            "trainer.total_epochs")
