"""What one sandboxed run may use (:class:`SandboxConfig`) and what came of it (:class:`SandboxResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Isolation = Literal["auto", "namespace", "userns", "bwrap", "audit"]
Status = Literal["pass", "fail", "timeout", "error", "memory"]
ISOLATIONS = ("auto", "namespace", "userns", "bwrap", "audit")


@dataclass
class SandboxConfig:
    """Limits for one sandboxed run. All sizes in MiB, times in seconds.

    ``isolation``: ``auto`` picks the strongest mode this machine allows (see :mod:`hybridflow.sandbox.modes`)
    and refuses to run when none of the OS-level modes works; ``audit`` (a Python audit hook, no OS isolation)
    is used only when named here, with a warning.
    ``memory_mb`` bounds every process (address space) *and* the sum over all processes of the run.
    ``max_processes`` bounds the processes (and threads) of the run, the program included.
    ``uid_base``/``uid_span``: when hybridflow runs as root, each run gets a random uid in
    ``[uid_base, uid_base + uid_span)`` so that the kernel's per-uid process count is private to the run.
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    disk_mb: int = 64
    max_output_bytes: int = 65536
    max_processes: int = 32
    max_open_files: int = 256
    isolation: Isolation = "auto"
    python_executable: str | None = None
    uid_base: int = 1_000_000
    uid_span: int = 1 << 20

    def __post_init__(self):
        _require(isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0,
                 "timeout_s", self.timeout_s, "use a positive number of seconds")
        _require(self.memory_mb >= 32, "memory_mb", self.memory_mb, "Python needs at least 32 MiB of address space")
        _require(self.disk_mb >= 1, "disk_mb", self.disk_mb, "use at least 1 MiB")
        _require(self.max_output_bytes >= 64, "max_output_bytes", self.max_output_bytes, "use at least 64 bytes")
        _require(self.max_processes >= 1, "max_processes", self.max_processes, "use at least 1")
        _require(self.max_open_files >= 16, "max_open_files", self.max_open_files, "use at least 16")
        _require(self.isolation in ISOLATIONS, "isolation", self.isolation,
                 "use " + ", ".join(repr(i) for i in ISOLATIONS))
        _require(self.uid_base >= 1000 and self.uid_span >= 1, "uid_base/uid_span", (self.uid_base, self.uid_span),
                 "use an unprivileged uid range (uid_base >= 1000)")


@dataclass
class SandboxResult:
    """Outcome of one run.

    ``status``: ``pass`` (exit code 0), ``fail`` (the program exited non-zero, was killed by a signal, or
    went over ``max_processes``), ``timeout`` (wall or CPU limit hit), ``memory`` (died of ``MemoryError``
    or its processes together went over ``memory_mb``), ``error`` (the sandbox itself could not start the
    program; ``stderr`` says why).
    ``stdout``/``stderr`` are decoded text capped at ``max_output_bytes`` each; ``*_truncated`` tells whether
    bytes were dropped. ``peak_memory_mb`` is the largest sum over the run's processes the watchdog saw
    (0 where no watchdog runs: ``audit`` mode, or a remote service).
    """

    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    isolation: str = ""
    peak_memory_mb: float = 0.0


def _require(ok: bool, field: str, value, fix: str) -> None:
    if not ok:
        raise ValueError(f"SandboxConfig.{field}={value!r} is invalid: {fix}")


__all__ = ["ISOLATIONS", "Isolation", "SandboxConfig", "SandboxResult", "Status"]
