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
tracker file replaced (write temp file + ``os.replace``) and the folder renamed to ``global_step_N`` (a rename is
atomic on POSIX): a kill between the two leaves a tracker naming a missing folder, and resume takes the newest
complete one.  A folder without the manifest is refused on resume with a clear message.

Completeness record: the manifest lists every file of the step with its size, so a file truncated or removed
after the save is noticed before loading (:func:`verify_checkpoint`). ``resume_mode=auto`` takes the folder
the tracker file names when it is complete; when the tracker is missing or names an unusable folder, it takes
the newest complete one by its own manifest and says so; a newer folder that fails its record is renamed
``global_step_N.broken-<time>`` (kept, never deleted) with a warning. A run never replaces checkpoints it did
not resume from: starting fresh, or from an older step, in a folder that holds later ``global_step_N``
folders is refused unless ``trainer.overwrite_checkpoints=true`` (:func:`check_overwrite`). A save that fails
(e.g. the disk is full) removes its temp folder, says why, and leaves the previous checkpoint as it was.

Why trainer state includes RNG: resuming must reproduce the uninterrupted run bit for bit (spec S10).  Any
randomness drawn on the controller (uids are not random-dependent, but sampling in an in-process rollout and
dataloader shuffles are) must continue from the same point.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from hybridflow.utils.rng_state import capture_rng_state, restore_rng_state
from hybridflow.utils.safe_load import load_torch_file

LATEST_FILE = "latest_checkpointed_iteration.txt"
MANIFEST_FILE = "hybridflow_checkpoint.json"
TRAINER_STATE_FILE = "trainer_state.pt"
DATA_STATE_FILE = "data.pt"
FORMAT_VERSION = 1
RUN_LOCK_FILE = "hybridflow_run.lock"
_STEP_RE = re.compile(r"^global_step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (missing, half-written, foreign); the message says what to do."""


def _warn(message: str) -> None:
    print(f"hybridflow: warning: {message}", file=sys.stderr, flush=True)


_DISK_FULL_MARKERS = ("no space left", "enospc", "unexpected pos", "file write failed", "errno 28",
                      "disk quota exceeded")


@dataclass
class TrainerState:
    """Everything the controller itself must restore for an exact continuation."""

    global_step: int
    epoch: int
    rng: dict[str, Any] = field(default_factory=dict)
    kl_ctrl: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


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
        if self._committed:
            return
        disk_full = exc is not None and _is_disk_full(exc, self.root)
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        if disk_full:
            previous = completed_steps(self.root)
            kept = f"the previous checkpoint {step_dir(self.root, previous[-1])} is kept" if previous else \
                "there is no earlier checkpoint"
            raise CheckpointError(
                f"saving the checkpoint of step {self.global_step} into {self.root} failed: the disk is full "
                f"({shutil.disk_usage(self.root).free / 2**20:.1f} MiB free now); "
                f"{kept}. Free space, lower trainer.max_actor_ckpt_to_keep, or point trainer.default_local_dir at "
                f"a bigger disk ({type(exc).__name__}: {str(exc).splitlines()[-1][:200] if str(exc) else ''})"
            ) from exc

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
                    "global_step": self.global_step, "components": sorted(components),
                    "files": _file_sizes(self.tmp_dir)}
        atomic_write_text(self.tmp_dir / MANIFEST_FILE, json.dumps(manifest, indent=2))
        # the tracker first: a kill before the rename leaves it naming a folder that does not exist, which
        # resume_mode=auto passes over to the newest complete one; the other order left a complete newer folder
        # behind an older tracker, a state a resume refuses (it would replace that folder)
        atomic_write_text(self.root / LATEST_FILE, str(self.global_step))
        if self.final_dir.exists():  # re-saving the same step (e.g. after a resume): replace it whole
            trash = Path(tempfile.mkdtemp(prefix=f"{self.final_dir.name}.old-", dir=self.root))
            os.replace(self.final_dir, trash / self.final_dir.name)
            os.replace(self.tmp_dir, self.final_dir)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(self.tmp_dir, self.final_dir)
        self._committed = True
        return self.final_dir


def _is_disk_full(exc: BaseException, root: Path) -> bool:
    """An ENOSPC anywhere in the chain, a message torch/Ray write for it, or (almost) no space left."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(m in str(seen).lower() for m in _DISK_FULL_MARKERS):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(root).free < 2**20
    except OSError:
        return False


def _file_sizes(folder: Path) -> dict[str, int]:
    """``{relative path: size}`` of every file under ``folder`` (the manifest's completeness record)."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != MANIFEST_FILE}


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
            if "files" in manifest:
                manifest["files"] = {k: v for k, v in manifest["files"].items() if not k.startswith(component + "/")}
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


# ---------------------------------------------------------------------------------------------- one writer
class CheckpointDirLock:
    """This process's hold on ``default_local_dir``: a lock file naming the holder (pid, host, start time) and an
    ``flock`` on it that the kernel drops when the holder dies, so a lock left by a crash is recognised as stale.
    Two runs saving into one folder would interleave their ``global_step_*`` folders (issue 34)."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            if _lock_holder(self.path).get("pid") == os.getpid():
                self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)  # drops the flock
        self.fd = -1
        _HELD_LOCKS.pop(str(self.path.parent), None)


_HELD_LOCKS: dict[str, CheckpointDirLock] = {}


def _lock_holder(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def lock_checkpoint_dir(root: str | os.PathLike) -> CheckpointDirLock:
    """Hold ``root`` for this run until :meth:`CheckpointDirLock.release` or the process ends; a second run gets
    a :class:`CheckpointError` naming the holder. Re-entrant within one process."""
    import atexit
    import fcntl
    import socket

    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if str(root) in _HELD_LOCKS:
        return _HELD_LOCKS[str(root)]
    path, host = root / RUN_LOCK_FILE, socket.gethostname()
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CheckpointError(_held_message(root, path, _lock_holder(path), "is saving into it")) from None
        try:
            same_file = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            break
        os.close(fd)  # the holder released (unlinked) it between our open and flock: take the new file
    holder = _lock_holder(path)
    if holder and holder.get("host") != host:
        os.close(fd)  # its flock may not reach us across hosts: whether it still runs cannot be told from here
        raise CheckpointError(_held_message(root, path, holder, "may still be saving into it") +
                              f"; if that run has ended, delete {path}")
    if holder:
        _warn(f"{path}: the run that held this checkpoint folder (pid {holder.get('pid')}) is gone; taking it over")
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": host, "since": time.time()}).encode(), 0)
    os.fsync(fd)
    lock = _HELD_LOCKS[str(root)] = CheckpointDirLock(path, fd)
    atexit.register(lock.release)
    return lock


def _held_message(root: Path, path: Path, holder: dict[str, Any], doing: str) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return (f"checkpoint folder {root} is in use: another run (pid {holder.get('pid', '?')} on host "
            f"{holder.get('host', '?')}, since {since}; lock file {path}) {doing}, and two runs saving into one "
            "folder interleave their global_step_* folders. Give this run its own trainer.default_local_dir, "
            "or wait for that run to end")


def release_checkpoint_dir(root: str | os.PathLike) -> None:
    """Let go of ``root`` if this process holds it (the run ended)."""
    lock = _HELD_LOCKS.get(str(Path(root).resolve()))
    if lock is not None:
        lock.release()


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
    * ``auto``: the folder named by ``latest_checkpointed_iteration.txt`` when it is complete; when the file is
      missing or names an unusable folder, the newest complete checkpoint (said on stderr); none -> fresh start.
    * ``resume_path``: exactly ``trainer.resume_from_path`` (must be a complete ``global_step_N`` folder).
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
        problems = verify_checkpoint(folder)
        if problems:
            raise CheckpointError(f"trainer.resume_from_path={resume_from_path} is not a complete checkpoint: "
                                  + "; ".join(problems[:3]) + ". Pick another global_step_N folder")
        return folder
    if resume_mode != "auto":
        raise CheckpointError(
            f"trainer.resume_mode={resume_mode!r} is not one of auto, disable, resume_path"
        )
    return _auto_resume_dir(Path(root))


def verify_checkpoint(folder: str | os.PathLike) -> list[str]:
    """What is wrong with ``folder`` by its own completeness record (empty: complete). Checkpoints written
    before the record existed are checked for their manifest only."""
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except (CheckpointError, ValueError) as e:
        return [str(e)]
    problems = []
    for rel, size in (manifest.get("files") or {}).items():
        path = folder / rel
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != size:
            problems.append(f"{path} has {path.stat().st_size} bytes, its checkpoint recorded {size} (truncated "
                            "or changed after the save)")
    return problems


def _marked_step(root: Path) -> tuple[int | None, str | None]:
    """(step the tracker file names, None) or (None, why it cannot be used); (None, None) when absent."""
    latest = root / LATEST_FILE
    if not latest.is_file():
        return None, None
    text = latest.read_text().strip()
    if not text.isdigit():
        return None, f"{latest} holds {text[:40]!r}, not a step number"
    return int(text), None


def _set_aside(folder: Path, problems: list[str]) -> Path:
    target = folder.with_name(f"{folder.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(folder, target)
    _warn(f"{folder} is not a usable checkpoint ({'; '.join(problems[:3])}); moved to {target.name} (kept, "
          "not deleted) so that this run does not write over it")
    return target


def _auto_resume_dir(root: Path) -> Path | None:
    """The tracker's folder when it is complete, else the newest complete one (said); None on a fresh start."""
    marked, why = _marked_step(root)
    if marked is not None:
        folder = step_dir(root, marked)
        problems = verify_checkpoint(folder) if folder.is_dir() else [f"{folder} does not exist"]
        if not problems:
            return folder
        why = f"{root / LATEST_FILE} names {folder.name}, which is not usable: {problems[0]}"
    elif why is None and completed_steps(root):
        why = f"{root / LATEST_FILE} is missing"
    if why is None:
        return None
    broken: list[tuple[Path, list[str]]] = []
    for step in reversed(completed_steps(root)):
        folder = step_dir(root, step)
        problems = verify_checkpoint(folder)
        if problems:
            broken.append((folder, problems))
            continue
        for bad, bad_problems in broken:
            _set_aside(bad, bad_problems)
        _warn(f"{why}; resuming from {folder}, the newest checkpoint whose manifest shows it complete")
        return folder
    details = "; ".join(f"{f.name}: {p[0]}" for f, p in broken) or "no folder has a manifest"
    raise CheckpointError(
        f"cannot resume from {root}: {why}, and no complete checkpoint is left ({details}). Repair or remove "
        "the folders, point trainer.resume_from_path at a good one (trainer.resume_mode=resume_path), or start "
        "over with trainer.resume_mode=disable trainer.overwrite_checkpoints=true"
    )


def check_overwrite(root: str | os.PathLike, resumed: Path | None, saves: bool, allowed: bool) -> None:
    """Refuse to start when this run's saves would replace ``global_step_N`` folders it did not resume from."""
    if allowed or not saves:
        return
    root = Path(root)
    if not root.is_dir():
        return
    start = int(_STEP_RE.match(resumed.name).group(1)) if resumed is not None else 0
    later = sorted((int(m.group(1)), p.name) for p in root.iterdir() if (m := _STEP_RE.match(p.name)))
    later = [name for step, name in later if step > start]
    if later:
        how = f"resumes from {resumed.name}" if resumed is not None else "starts fresh"
        raise CheckpointError(
            f"{root} already holds {', '.join(later[:6])}{' ...' if len(later) > 6 else ''}, which this run ({how}) "
            "would replace when it saves. Resume from the newest (trainer.resume_mode=auto), move them away, "
            "use another trainer.default_local_dir, or set trainer.overwrite_checkpoints=true to replace them"
        )


def load_trainer_state(folder: str | os.PathLike) -> TrainerState:
    raw = load_torch_file(Path(folder) / TRAINER_STATE_FILE)
    return TrainerState(**raw)


def load_data_state(folder: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(folder) / DATA_STATE_FILE
    return load_torch_file(path) if path.is_file() else None

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
    "CheckpointDirLock",
    "CheckpointError",
    "RUN_LOCK_FILE",
    "lock_checkpoint_dir",
    "lora_metadata",
    "release_checkpoint_dir",
    "CheckpointWriter",
    "TrainerState",
    "LATEST_FILE",
    "MANIFEST_FILE",
    "capture_rng_state",
    "restore_rng_state",
    "check_overwrite",
    "clean_stale_temp_dirs",
    "completed_steps",
    "find_resume_dir",
    "load_data_state",
    "load_trainer_state",
    "read_manifest",
    "rotate_checkpoints",
    "step_dir",
    "verify_checkpoint",
]
