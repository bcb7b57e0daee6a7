"""Trainer-side checkpoints: atomic step folders, keep-last-K rotation, resume discovery, exact state.

Layout (verl's, so users' scripts that look for it keep working)::

    default_local_dir/
      latest_checkpointed_iteration.txt      # "N", written last and atomically
      global_step_N/
        actor/ ...                           # written by the actor worker group
        critic/ ...                          # written by the critic worker group (if any)
        data.pt                              # dataloader / sampler state_dict
        trainer_state.pt                     # step, epoch, RNG states, KL controller state
        hybridflow_checkpoint.json           # manifest: proves the folder is ours and complete

Why atomic: verl writes straight into ``global_step_N`` and updates the tracker file even when a worker died
mid-save, so a crash can leave a half-written checkpoint that ``resume_mode=auto`` then loads.  Here every
piece is written into ``global_step_N.tmp-<random>``; only when all of it is on disk (manifest last) is the
folder renamed to ``global_step_N`` (a rename is atomic on POSIX), and only then is the tracker file replaced
(write temp file + ``os.replace``).  A folder without the manifest is refused on resume with a clear message.

Why trainer state includes RNG: resuming must reproduce the uninterrupted run bit for bit (spec S10).  Any
randomness drawn on the controller (uids are not random-dependent, but sampling in an in-process rollout and
dataloader shuffles are) must continue from the same point.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST_FILE = "latest_checkpointed_iteration.txt"
MANIFEST_FILE = "hybridflow_checkpoint.json"
TRAINER_STATE_FILE = "trainer_state.pt"
DATA_STATE_FILE = "data.pt"
FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^global_step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (missing, half-written, foreign); the message says what to do."""


@dataclass
class TrainerState:
    """Everything the controller itself must restore for an exact continuation."""

    global_step: int
    epoch: int
    rng: dict[str, Any] = field(default_factory=dict)
    kl_ctrl: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- RNG
def capture_rng_state() -> dict[str, Any]:
    """RNG states of python, numpy and torch (CPU and, when present, CUDA) in this process."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------- paths
def step_dir(root: str | os.PathLike, global_step: int) -> Path:
    return Path(root) / f"global_step_{global_step}"


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see either the old or the new content, never a prefix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def completed_steps(root: str | os.PathLike) -> list[int]:
    """Steps with a complete (manifest-bearing) ``global_step_N`` folder under ``root``, ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        m = _STEP_RE.match(child.name)
        if m and (child / MANIFEST_FILE).is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)


# ---------------------------------------------------------------------------------------------- save
class CheckpointWriter:
    """One atomic save: ``tmp_dir`` is filled by the caller (workers + controller), then ``commit()``.

    Usage::

        with CheckpointWriter(root, step) as w:
            actor_wg.save_checkpoint(str(w.tmp_dir / "actor"), step, None)
            w.save_trainer_state(state); w.save_data_state(loader.state_dict())
            w.commit(components=["actor"])

    Leaving the ``with`` block without ``commit()`` (an exception) deletes the temp folder, so a failed
    save never shadows the previous good checkpoint.
    """

    def __init__(self, root: str | os.PathLike, global_step: int):
        self.root = Path(root)
        self.global_step = int(global_step)
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"global_step_{self.global_step}.tmp-", dir=self.root))
        self.final_dir = step_dir(self.root, self.global_step)
        self._committed = False

    def __enter__(self) -> "CheckpointWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._committed:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)

    def save_trainer_state(self, state: TrainerState) -> None:
        torch.save(asdict(state), self.tmp_dir / TRAINER_STATE_FILE)

    def save_data_state(self, state: dict[str, Any]) -> None:
        torch.save(state, self.tmp_dir / DATA_STATE_FILE)

    def commit(self, components: list[str], metadata: dict[str, Any] | None = None) -> Path:
        """Write the manifest, move the folder into place, then point the tracker file at it.

        ``metadata`` (e.g. the LoRA settings ``merge_checkpoint`` needs) is stored in the manifest.
        """
        missing = [c for c in components if not (self.tmp_dir / c).exists()]
        if missing:
            raise CheckpointError(
                f"checkpoint for step {self.global_step} is missing {missing} in {self.tmp_dir}; "
                "a worker group did not write its part, so the checkpoint was not committed"
            )
        manifest = {**(metadata or {}), "format": "hybridflow", "version": FORMAT_VERSION,
                    "global_step": self.global_step, "components": sorted(components)}
        atomic_write_text(self.tmp_dir / MANIFEST_FILE, json.dumps(manifest, indent=2))
        if self.final_dir.exists():  # re-saving the same step (e.g. after a resume): replace it whole
            trash = Path(tempfile.mkdtemp(prefix=f"{self.final_dir.name}.old-", dir=self.root))
            os.replace(self.final_dir, trash / self.final_dir.name)
            os.replace(self.tmp_dir, self.final_dir)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(self.tmp_dir, self.final_dir)
        atomic_write_text(self.root / LATEST_FILE, str(self.global_step))
        self._committed = True
        return self.final_dir


def rotate_checkpoints(root: str | os.PathLike, component: str, keep: int | None) -> list[Path]:
    """Keep the newest ``keep`` copies of ``component`` (``actor`` / ``critic``); ``None``/``<=0`` keeps all.

    Removing an old step's actor makes that step unusable for resume, so its whole folder goes; a pruned
    critic only removes the ``critic`` sub-folder (the manifest is rewritten to say so).
    Returns the removed paths.
    """
    if keep is None or keep <= 0:
        return []
    root = Path(root)
    holders = [s for s in completed_steps(root) if (step_dir(root, s) / component).exists()]
    removed = []
    for s in holders[:-keep]:
        folder = step_dir(root, s)
        if component == "actor":
            # Drop the manifest first so a crash mid-delete leaves a folder resume refuses, not a broken one.
            (folder / MANIFEST_FILE).unlink()
            shutil.rmtree(folder)
            removed.append(folder)
        else:
            manifest = read_manifest(folder)
            manifest["components"] = [c for c in manifest["components"] if c != component]
            atomic_write_text(folder / MANIFEST_FILE, json.dumps(manifest, indent=2))
            shutil.rmtree(folder / component)
            removed.append(folder / component)
    return removed


def clean_stale_temp_dirs(root: str | os.PathLike) -> list[Path]:
    """Delete ``global_step_N.tmp-*`` / ``.old-*`` folders left by a crash during a save."""
    root = Path(root)
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if p.is_dir() and re.match(r"^global_step_\d+\.(tmp|old)-", p.name)]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


# ---------------------------------------------------------------------------------------------- load
def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    folder = Path(folder)
    path = folder / MANIFEST_FILE
    if not path.is_file():
        hint = (
            "It looks like a verl checkpoint; convert it to HF with verl's model merger and start from "
            "actor_rollout_ref.model.path instead."
            if (folder / "actor").is_dir()
            else "It was not written by hybridflow or its save was interrupted."
        )
        raise CheckpointError(
            f"{folder} is not a complete hybridflow checkpoint (no {MANIFEST_FILE}). {hint} "
            "Pick another folder with trainer.resume_from_path, or set trainer.resume_mode=disable."
        )
    manifest = json.loads(path.read_text())
    if manifest.get("format") != "hybridflow" or manifest.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format {manifest.get('format')!r} version {manifest.get('version')!r}; "
            f"this hybridflow reads format 'hybridflow' version {FORMAT_VERSION}"
        )
    return manifest


def find_resume_dir(root: str | os.PathLike, resume_mode: str, resume_from_path: str | None) -> Path | None:
    """Which step folder to resume from (``None`` = start fresh), following ``trainer.resume_mode``.

    * ``disable``: never resume.
    * ``auto``: the folder named by ``latest_checkpointed_iteration.txt``; none yet -> fresh start.
    * ``resume_path``: exactly ``trainer.resume_from_path`` (must be a ``global_step_N`` folder).
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise CheckpointError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>"
            )
        folder = Path(resume_from_path)
        if not _STEP_RE.match(folder.name):
            raise CheckpointError(
                f"trainer.resume_from_path={resume_from_path} must point at a global_step_N folder"
            )
        if not folder.is_dir():
            raise CheckpointError(f"trainer.resume_from_path={resume_from_path} does not exist")
        read_manifest(folder)
        return folder
    if resume_mode != "auto":
        raise CheckpointError(
            f"trainer.resume_mode={resume_mode!r} is not one of auto, disable, resume_path"
        )
    root = Path(root)
    latest = root / LATEST_FILE
    if not latest.is_file():
        return None
    text = latest.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{latest} holds {text!r}, expected a step number; fix or delete the file")
    folder = step_dir(root, int(text))
    if not folder.is_dir():
        raise CheckpointError(
            f"{latest} points at {folder.name}, which does not exist; delete the file to start fresh "
            "or set trainer.resume_mode=disable"
        )
    read_manifest(folder)
    return folder


def load_trainer_state(folder: str | os.PathLike) -> TrainerState:
    raw = torch.load(Path(folder) / TRAINER_STATE_FILE, weights_only=False)
    return TrainerState(**raw)


def load_data_state(folder: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(folder) / DATA_STATE_FILE
    return torch.load(path, weights_only=False) if path.is_file() else None

def lora_metadata(model_cfg) -> dict[str, Any] | None:
    """The manifest's ``lora`` entry (rank and alpha, for ``hybridflow merge``) of an actor that trains LoRA:
    from the saved adapter's own config when it started from ``model.lora_adapter_path``, else from the keys."""
    if model_cfg.lora_adapter_path:
        from hybridflow.engine.model_loader import read_adapter_config

        adapter = read_adapter_config(model_cfg.lora_adapter_path)
        return {"lora": {"lora_rank": int(adapter["r"]), "lora_alpha": float(adapter["lora_alpha"])}}
    if int(model_cfg.lora_rank) > 0:
        return {"lora": {"lora_rank": int(model_cfg.lora_rank), "lora_alpha": float(model_cfg.lora_alpha)}}
    return None


__all__ = [
    "CheckpointError",
    "lora_metadata",
    "CheckpointWriter",
    "TrainerState",
    "LATEST_FILE",
    "MANIFEST_FILE",
    "capture_rng_state",
    "restore_rng_state",
    "clean_stale_temp_dirs",
    "completed_steps",
    "find_resume_dir",
    "load_data_state",
    "load_trainer_state",
    "read_manifest",
    "rotate_checkpoints",
    "step_dir",
]
