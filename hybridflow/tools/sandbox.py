"""Run untrusted Python (model-written code) in a confined subprocess.

Code rewards and the ``code_interpreter`` tool execute whatever the policy writes, thousands of times per
step and in parallel; RL will find any hole (reading the test file, killing the trainer, exhausting memory).
verl delegates this to a remote "sandbox fusion" HTTP service; we run locally so a laptop needs nothing else.

Guarantees per call (details and the weaker fallback in docs/sandbox.md):
  * wall-time limit enforced by the host (SIGKILL to the whole process group and PID namespace) and a CPU-time
    limit (RLIMIT_CPU) enforced by the kernel;
  * address-space limit (RLIMIT_AS) -> ``status == "memory"`` when the program dies of ``MemoryError``;
  * no network: a fresh network namespace with only a down loopback;
  * a private root: tmpfs with read-only system dirs and the Python prefix; the project, /root, /home and
    /etc are not there; writable places are ``/sandbox`` (cwd), ``/tmp`` and ``/dev/shm``, on a size-capped tmpfs
    that vanishes with the namespace;
  * a dedicated random unprivileged uid with RLIMIT_NPROC, so fork bombs stop at ``max_processes``;
  * stdout/stderr read with a byte cap (never unbounded memory), stderr keeps head and tail.

Namespaces need root (CAP_SYS_ADMIN). Elsewhere ``isolation="auto"`` falls back to ``"audit"`` mode (resource
limits plus a PEP 578 audit hook in the child interpreter), which stops accidental and naive escapes only.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

Isolation = Literal["auto", "namespace", "audit"]
Status = Literal["pass", "fail", "timeout", "error", "memory"]

_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_launcher.py")
_SETUP_FAILED_EXIT = 125
_READ_CHUNK = 65536
_SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc/alternatives", "/etc/ld.so.cache")


@dataclass
class SandboxConfig:
    """Limits for one sandboxed run. All sizes in MiB, times in seconds.

    ``isolation``: ``auto`` picks ``namespace`` when the process may create namespaces (root), else ``audit``.
    ``uid_base``/``uid_span``: each run gets a random uid in ``[uid_base, uid_base + uid_span)`` so that
    RLIMIT_NPROC (a per-uid count) is private to the run even when many runs are in flight.
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
        _require(self.timeout_s > 0, "timeout_s", self.timeout_s, "use a positive number of seconds")
        _require(self.memory_mb >= 32, "memory_mb", self.memory_mb, "Python needs at least 32 MiB of address space")
        _require(self.disk_mb >= 1, "disk_mb", self.disk_mb, "use at least 1 MiB")
        _require(self.max_output_bytes >= 64, "max_output_bytes", self.max_output_bytes, "use at least 64 bytes")
        _require(self.max_processes >= 1, "max_processes", self.max_processes, "use at least 1")
        _require(self.max_open_files >= 16, "max_open_files", self.max_open_files, "use at least 16")
        _require(self.isolation in ("auto", "namespace", "audit"), "isolation", self.isolation,
                 "use 'auto', 'namespace' or 'audit'")
        _require(self.uid_base >= 1000 and self.uid_span >= 1, "uid_base/uid_span", (self.uid_base, self.uid_span),
                 "use an unprivileged uid range (uid_base >= 1000)")


@dataclass
class SandboxResult:
    """Outcome of one run.

    ``status``: ``pass`` (exit code 0), ``fail`` (the program exited non-zero or was killed by a signal),
    ``timeout`` (wall or CPU limit hit), ``memory`` (died of MemoryError under the address-space limit),
    ``error`` (the sandbox itself could not start the program; ``stderr`` says why).
    ``stdout``/``stderr`` are decoded text capped at ``max_output_bytes`` each; ``*_truncated`` tells whether
    bytes were dropped.
    """

    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    isolation: str = ""


def _require(ok: bool, field: str, value, fix: str) -> None:
    if not ok:
        raise ValueError(f"SandboxConfig.{field}={value!r} is invalid: {fix}")


@functools.lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """True when this process may create mount/network/PID namespaces (checked once by a real attempt)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--net", "--mount", "--pid", "--fork", "true"], capture_output=True)
    return probe.returncode == 0


def resolve_isolation(config: SandboxConfig) -> str:
    if config.isolation == "auto":
        return "namespace" if namespaces_available() else "audit"
    if config.isolation == "namespace" and not namespaces_available():
        raise RuntimeError(
            "SandboxConfig.isolation='namespace' needs Linux namespaces (run as root / CAP_SYS_ADMIN); "
            "use isolation='auto' to fall back to the weaker 'audit' mode"
        )
    return config.isolation


def _python_executable(config: SandboxConfig) -> str:
    exe = config.python_executable or getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(exe)


def _host_python() -> str:
    """The launcher always runs on this interpreter (stdlib only), whatever runs the user code."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _readonly_paths(python: str) -> list[str]:
    """System dirs plus the interpreter's prefix when it lives outside them (pyenv, conda, toolcache)."""
    prefix = os.path.realpath(sys.base_prefix)
    paths = list(_SYSTEM_DIRS)
    for extra in (prefix, os.path.dirname(os.path.dirname(python))):
        if extra in ("", "/"):
            continue  # never expose the whole host tree (e.g. python_executable="/bin/python3")
        if not any(extra == p or extra.startswith(p + "/") for p in paths):
            paths.append(extra)
    return paths


def _spec(config: SandboxConfig, isolation: str, workdir: str) -> dict:
    python = _python_executable(config)
    uid = config.uid_base + secrets.randbelow(config.uid_span)
    return {
        "isolation": isolation,
        "python": python,
        "host_workdir": workdir,
        "root_dir": os.path.join(workdir, "root"),
        "readonly_paths": _readonly_paths(python),
        "uid": uid,
        "gid": uid,
        "cpu_limit_s": max(1, math.ceil(config.timeout_s)),
        "memory_mb": config.memory_mb,
        "disk_mb": config.disk_mb,
        "max_processes": config.max_processes,
        "max_open_files": config.max_open_files,
        "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/sandbox", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
                "PYTHONIOENCODING": "utf-8"},
    }


class _CappedBuffer:
    """Keeps the first ``cap`` bytes (and, when ``keep_tail``, the last ``cap // 2``) of a stream."""

    def __init__(self, cap: int, keep_tail: bool):
        self.cap = cap
        self.keep_tail = keep_tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        head_cap = self.cap // 2 if self.keep_tail else self.cap
        room = head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if self.keep_tail and data:
            self.tail = (self.tail + data)[-(self.cap - head_cap):]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        out = self.head.decode("utf-8", errors="replace")
        if self.truncated:
            dropped = self.total - len(self.head) - len(self.tail)
            out += f"\n...[truncated {dropped} bytes]...\n"
        return out + self.tail.decode("utf-8", errors="replace")


def _pump(proc: subprocess.Popen, stdin: bytes, deadline: float, out: _CappedBuffer, err: _CappedBuffer) -> bool:
    """Feed stdin and drain stdout/stderr until both close or the deadline passes. Returns True on timeout."""
    sel = selectors.DefaultSelector()
    streams = {proc.stdout: out, proc.stderr: err}
    for f in streams:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    view = memoryview(stdin)
    if view:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    try:
        while len(sel.get_map()) > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            for key, _ in sel.select(timeout=remaining):
                if key.fileobj is proc.stdin:
                    try:
                        view = view[os.write(proc.stdin.fileno(), view[:_READ_CHUNK]):]
                    except (BrokenPipeError, OSError):
                        view = view[:0]
                    if not view:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fileobj.fileno(), _READ_CHUNK)
                if chunk:
                    streams[key.fileobj].feed(chunk)
                else:
                    sel.unregister(key.fileobj)
        return False
    finally:
        sel.close()


def _exited_by(pid: int, deadline: float) -> bool:
    """Wait (without reaping) until ``pid`` has exited or ``deadline`` passes; True when it exited.

    Not reaping keeps the launcher a zombie, so its process-group id cannot be reused before we ``killpg`` it.
    """
    delay = 0.001
    while True:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _stop(proc: subprocess.Popen, workdir: str) -> None:
    """Kill a run that is still going (without reaping it).

    In namespace mode the PID-namespace init is killed first: the kernel then kills every process of the
    namespace and the launcher exits only after they are all gone. Killing the launcher's process group is
    the fallback (and the whole story in audit mode, where the program *is* the launcher process).
    """
    try:
        with open(os.path.join(workdir, "init.pid")) as f:
            init_pid = int(f.read() or 0)
    except (OSError, ValueError):
        init_pid = 0
    if init_pid > 0 and not _exited_by(proc.pid, 0):
        try:
            os.kill(init_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if _exited_by(proc.pid, time.monotonic() + 5.0):
            return
    _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher's session/process group (the launcher leads it: ``start_new_session=True``)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _classify(returncode: int | None, timed_out: bool, cpu_s: float, cpu_limit: int, stderr: str) -> Status:
    if timed_out or returncode == -signal.SIGXCPU:
        return "timeout"
    if returncode == -signal.SIGKILL and cpu_s >= cpu_limit - 0.05:
        return "timeout"
    if returncode == 0:
        return "pass"
    last = [line for line in stderr.strip().splitlines() if line.strip()][-1:] or [""]
    if last[0].startswith("MemoryError"):
        return "memory"
    return "fail"


def run_python(
    code: str,
    stdin: str = "",
    timeout_s: float | None = None,
    memory_mb: int | None = None,
    config: SandboxConfig | None = None,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` under the limits of ``config`` (``timeout_s``/``memory_mb`` override it).

    Thread-safe: every call has its own temp dir, uid, process group and namespaces. Never raises for anything
    the code does; raises only for invalid arguments.
    """
    if not isinstance(code, str):
        raise TypeError(f"run_python(code=...) must be a str, got {type(code).__name__}")
    config = config or SandboxConfig()
    if timeout_s is not None or memory_mb is not None:
        config = dataclasses.replace(config, timeout_s=config.timeout_s if timeout_s is None else timeout_s,
                                     memory_mb=config.memory_mb if memory_mb is None else memory_mb)
    isolation = resolve_isolation(config)
    workdir = tempfile.mkdtemp(prefix="hybridflow-sandbox-")
    try:
        return _run_in(workdir, code, stdin, config, isolation)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_in(workdir: str, code: str, stdin: str, config: SandboxConfig, isolation: str) -> SandboxResult:
    spec = _spec(config, isolation, workdir)
    with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
        f.write(code)
    spec_path = os.path.join(workdir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    out = _CappedBuffer(config.max_output_bytes, keep_tail=False)
    err = _CappedBuffer(config.max_output_bytes, keep_tail=True)
    start = time.monotonic()
    proc = subprocess.Popen(
        [_host_python(), "-I", "-S", "-B", _LAUNCHER, spec_path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, cwd=workdir, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    deadline = start + config.timeout_s
    exited = False
    try:
        timed_out = _pump(proc, stdin.encode("utf-8"), deadline, out, err)
        # Pipes closed, but the program may still run (it can close its own stdout).
        exited = not timed_out and _exited_by(proc.pid, deadline)
        timed_out = not exited
    finally:
        if not exited:
            _stop(proc, workdir)
        _kill_group(proc)  # stragglers of the group; safe: the unreaped launcher still holds the group id
        _, status, usage = os.wait4(proc.pid, 0)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if not f.closed:
                f.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    setup_error = os.path.join(workdir, "setup_error.txt")
    if os.path.exists(setup_error) and os.path.getsize(setup_error) > 0:
        with open(setup_error) as f:
            message = f"sandbox setup failed ({isolation} mode):\n{f.read()}"
        return SandboxResult("error", None, "", message, wall, isolation=isolation)
    stderr_text = err.text()
    status_ = _classify(proc.returncode, timed_out, usage.ru_utime + usage.ru_stime, spec["cpu_limit_s"],
                        stderr_text)
    return SandboxResult(status_, proc.returncode, out.text(), stderr_text, wall,
                         stdout_truncated=out.truncated, stderr_truncated=err.truncated, isolation=isolation)


__all__ = ["SandboxConfig", "SandboxResult", "run_python", "namespaces_available", "resolve_isolation"]
