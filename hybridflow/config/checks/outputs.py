"""Output folders (run stage of the check pipeline): every one is writable and has room for a checkpoint.

Without them, an unwritable ``trainer.default_local_dir`` or a full disk surfaces at the first
``save_freq`` step -- after minutes (or hours) of training that is then lost. Checking up front costs a few
milliseconds: write and delete a probe file where each folder is (or will be created), and compare ``shutil.disk_usage`` with a
conservative estimate of one checkpoint's size.

The estimate: a checkpoint holds the actor's parameters, its optimizer state (Adam keeps two
moments per parameter) and, with a critic, the same again -- about ``3 x`` the fp32 model size per model
(Kingma & Ba 2015 for Adam's two moments). The model size is read from the ``*.safetensors`` / ``*.bin``
files in ``model.path`` (their dtype may be bf16, so the estimate doubles it to fp32).
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class PreflightError(ValueError):
    """An output location cannot be used; the message names the config key, the path and the fix."""


@dataclass(frozen=True)
class OutputDir:
    """One folder the run will write into, with the config key that sets it (for the error message)."""

    key: str
    path: str


def output_dirs(config, logger_dir: str | os.PathLike | None = None) -> list[OutputDir]:
    """The folders a run writes into: checkpoints, rollout / validation dumps, and the logger's folder."""
    tcfg = config.trainer
    dirs = [OutputDir("trainer.default_local_dir", tcfg.default_local_dir)]
    if tcfg.rollout_data_dir:
        dirs.append(OutputDir("trainer.rollout_data_dir", tcfg.rollout_data_dir))
    if tcfg.validation_data_dir:
        dirs.append(OutputDir("trainer.validation_data_dir", tcfg.validation_data_dir))
    if logger_dir is not None:
        dirs.append(OutputDir("trainer.project_name/trainer.experiment_name (logger folder)", str(logger_dir)))
    return dirs


def _nearest_existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_writable(key: str, path: str | os.PathLike) -> Path:
    """Prove a file can be created (and removed) where ``path`` is or will be; returns the folder checked.

    Nothing is left behind: a folder that does not exist yet is not created (a run that then fails on bad
    data would leave empty folders); its nearest existing ancestor, where the run will create it, is probed
    instead. The probe is a real write because permission bits alone lie (root, ACLs, read-only mounts).
    """
    target = Path(os.path.expanduser(str(path)))
    folder = _nearest_existing(target)
    try:
        if not folder.is_dir():
            raise NotADirectoryError(20, f"{folder} is a file, not a folder")
        probe = folder / f".hybridflow-write-probe-{uuid.uuid4().hex}"
        with open(probe, "wb") as f:
            f.write(b"ok")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as e:
        raise PreflightError(
            f"{key}={path} is not a writable folder ({type(e).__name__}: {e.strerror or e}); "
            f"point {key} at a folder this user can write, or fix its permissions"
        ) from None
    return folder


def model_bytes(model_path: str | os.PathLike) -> int:
    """Bytes of weight files in a local model folder (0 for a hub name or a folder without weights)."""
    folder = Path(os.path.expanduser(str(model_path)))
    if not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def _saved_model_bytes(model_path: str) -> int:
    """One model's share of a checkpoint: weights read as bf16 -> fp32 (x2), params + 2 Adam moments (x3)."""
    return 2 * model_bytes(model_path) * 3


def estimate_checkpoint_bytes(config) -> int:
    """Conservative size of one saved step: fp32 params + two Adam moments, for the actor and the critic."""
    total = _saved_model_bytes(config.actor_rollout_ref.model.path)
    if config.use_critic:
        total += _saved_model_bytes(config.critic.model.path)
    return total


def check_free_space(key: str, path: str | os.PathLike, need_bytes: int) -> int:
    """Raise unless the file system holding ``path`` has ``need_bytes`` free; returns the free bytes."""
    free = shutil.disk_usage(_nearest_existing(Path(os.path.expanduser(str(path))))).free
    if free < need_bytes:
        raise PreflightError(
            f"{key}={path}: only {free / 2**20:.1f} MiB free on that disk, but one checkpoint needs about "
            f"{need_bytes / 2**20:.1f} MiB; free some space, point {key} at a larger disk, or lower "
            "trainer.max_actor_ckpt_to_keep"
        )
    return free


def check_output_dirs(cfg, errors: list[str], notes: list[str], ctx) -> None:
    """Every configured output folder is writable; the checkpoint folder has room for the checkpoints kept
    (only when checkpoints will be written: ``save_freq > 0``)."""
    logger_dir = ctx.logger_dir if ctx is not None and ctx.logger_dir is not None else default_logger_dir(cfg)
    for out in output_dirs(cfg, logger_dir):
        try:
            check_writable(out.key, out.path)
        except PreflightError as e:
            errors.append(str(e))
    tcfg = cfg.trainer
    if tcfg.save_freq > 0:
        keep = tcfg.max_actor_ckpt_to_keep
        # Rotation deletes the oldest step only after the new one is committed: keep + 1 copies at the peak.
        copies = (keep + 1) if keep and keep > 0 else 2
        try:
            check_free_space("trainer.default_local_dir", tcfg.default_local_dir,
                             copies * estimate_checkpoint_bytes(cfg))
        except PreflightError as e:
            errors.append(str(e))


def default_logger_dir(cfg) -> Path:
    """Where ``trainer.logger`` backends write when no logger object is handed in: outputs/<project>/<experiment>."""
    return Path("outputs") / cfg.trainer.project_name / cfg.trainer.experiment_name


__all__ = ["PreflightError", "OutputDir", "output_dirs", "check_writable", "check_free_space", "model_bytes",
           "estimate_checkpoint_bytes", "check_output_dirs", "default_logger_dir"]
