"""Host side of one sandboxed run in a given isolation mode: write the spec, start the launcher, feed stdin,
drain output with a cap, enforce the wall time, read the supervisor's report and classify the outcome.

How each mode confines the program is in :mod:`hybridflow.sandbox.launcher` (and docs/sandbox.md); which mode
to use is :mod:`hybridflow.sandbox.modes`' job.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hybridflow.sandbox import seccomp
from hybridflow.sandbox.limits import SandboxConfig, SandboxResult, Status

_HERE = Path(__file__).resolve().parent
_LAUNCHER = str(_HERE / "launcher.py")
_SUPERVISOR = str(_HERE / "supervisor.py")
_AUDIT_BOOTSTRAP = str(_HERE / "audit_bootstrap.py")
_READ_CHUNK = 65536
_SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc/alternatives", "/etc/ld.so.cache")
INNER_UID = INNER_GID = 1000
POLL_S = 0.01


def python_executable(config: SandboxConfig) -> str:
    exe = config.python_executable or getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(exe)


def _host_python() -> str:
    """The launcher always runs on this interpreter (stdlib only), whatever runs the user code."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def readonly_paths(python: str) -> list[str]:
    """System dirs plus the program interpreter's installation when it lives outside them (pyenv, conda)."""
    paths = list(_SYSTEM_DIRS)
    prefix = os.path.dirname(os.path.dirname(python))
    if prefix not in ("", "/") and not any(prefix == p or prefix.startswith(p + "/") for p in paths):
        paths.append(prefix)  # never the whole host tree (e.g. python_executable="/bin/python3")
    return paths


def _world_reachable(path: str) -> bool:
    """True when an unrelated uid can reach and read ``path`` (every parent searchable, the path readable)."""
    p = Path(path)
    try:
        for parent in list(p.parents)[::-1]:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(p).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IROTH) and (not stat.S_ISDIR(mode) or bool(mode & stat.S_IXOTH))


def _bwrap_argv(bwrap: str, spec: dict) -> list[str]:
    """bubblewrap's command line; ``{..._fd}`` fields are filled in by the launcher once it opened them."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--as-pid-1", "--uid", str(INNER_UID), "--gid", str(INNER_GID), "--hostname", "sandbox", "--clearenv",
            "--cap-drop", "ALL", "--info-fd", "{info_fd}"]
    for path in spec["readonly_paths"]:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    for dev in ("null", "zero", "random", "urandom"):
        argv += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    size = str(spec["disk_mb"] * 1024 * 1024)
    argv += ["--proc", "/proc", "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/sandbox",
             "--symlink", "/tmp", "/dev/shm",
             "--perms", "0444", "--ro-bind-data", "{supervisor_fd}", "/.hf/supervisor.py",
             "--perms", "0444", "--ro-bind-data", "{spec_fd}", "/.hf/spec.json",
             "--perms", "0644", "--file", "{main_fd}", "/sandbox/main.py",
             "--chdir", "/sandbox", "--remount-ro", "/"]
    if spec.get("seccomp_path"):
        argv += ["--seccomp", "{seccomp_fd}"]
    python = spec["python"]
    return argv + ["--", python, "-I", "-S", "-B", "/.hf/supervisor.py", "/.hf/spec.json", "{report_fd}"]


def build_spec(config: SandboxConfig, isolation: str, workdir: str, allow_forks: int = 0) -> dict:
    python = python_executable(config)
    privileged = os.geteuid() == 0
    uid = config.uid_base + secrets.randbelow(config.uid_span) if privileged else os.geteuid()
    filter_bytes = seccomp.build_filter() if isolation in ("namespace", "userns", "bwrap") else None
    seccomp_path = None
    if filter_bytes is not None:
        seccomp_path = os.path.join(workdir, "seccomp.bpf")
        Path(seccomp_path).write_bytes(filter_bytes)
    spec = {
        "isolation": isolation,
        "python": python,
        "host_workdir": workdir,
        "root_dir": os.path.join(workdir, "root"),
        "readonly_paths": readonly_paths(python),
        "privileged": privileged,
        "uid": uid,
        "gid": uid if privileged else os.getegid(),
        "inner_uid": INNER_UID,
        "inner_gid": INNER_GID,
        "cpu_limit_s": max(1, math.ceil(config.timeout_s)),
        "memory_mb": config.memory_mb,
        "disk_mb": config.disk_mb,
        "max_processes": config.max_processes,
        "nproc_limit": config.max_processes + 1,  # the supervisor runs under the same uid
        "max_open_files": config.max_open_files,
        "poll_s": POLL_S,
        "supervisor_path": _SUPERVISOR,
        "audit_bootstrap_path": _AUDIT_BOOTSTRAP,
        "seccomp_path": seccomp_path,
        "seccomp_inner": "/.hf/seccomp.bpf" if seccomp_path and isolation in ("namespace", "userns") else None,
        "allow_forks": int(allow_forks),
        "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/sandbox", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
                "PYTHONIOENCODING": "utf-8"},
    }
    if isolation == "bwrap":
        bwrap = shutil.which("bwrap") or "bwrap"
        spec["bwrap_argv"] = _bwrap_argv(bwrap, spec)
        # As root, run bwrap as the run's own uid when it can still reach everything it binds: the kernel then
        # counts the run's processes against that uid (under uid 0 only the supervisor's count holds).
        needed = [python, bwrap] + [p for p in spec["readonly_paths"] if os.path.exists(p)]
        spec["bwrap_as_uid"] = privileged and all(_world_reachable(p) for p in needed)
        if spec["bwrap_as_uid"]:
            os.chown(workdir, uid, spec["gid"])
    return spec


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


def _sandbox_init_pid(workdir: str) -> int:
    """Host pid of the namespace's init (the supervisor): ``init.pid`` from our launcher, or bwrap's info."""
    try:
        with open(os.path.join(workdir, "init.pid")) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(workdir, "bwrap-info.json")) as f:
            return int(json.load(f).get("child-pid") or 0)
    except (OSError, ValueError, AttributeError):
        return 0


def _gone(pid: int, deadline: float) -> bool:
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _stop(proc: subprocess.Popen, workdir: str) -> None:
    """Kill a run that is still going (without reaping the launcher).

    Killing the PID-namespace init makes the kernel kill every process of the namespace; the launcher exits
    once they are all gone. Killing the launcher's process group is the fallback (and the whole story in
    audit mode, where the program *is* the launcher process).
    """
    init_pid = _sandbox_init_pid(workdir)
    if init_pid > 0 and not _exited_by(proc.pid, 0):
        try:
            os.kill(init_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if _exited_by(proc.pid, time.monotonic() + 5.0):
            _gone(init_pid, time.monotonic() + 5.0)
            return
    _kill_group(proc)
    if init_pid > 0:
        _gone(init_pid, time.monotonic() + 5.0)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher's session/process group (the launcher leads it: ``start_new_session=True``)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_reports(workdir: str) -> list[dict]:
    try:
        lines = Path(workdir, "report.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


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


def execute(code: str, stdin: str, config: SandboxConfig, isolation: str, allow_forks: int = 0) -> SandboxResult:
    """Run ``code`` as ``main.py`` in ``isolation`` (already resolved) under ``config``'s limits."""
    workdir = tempfile.mkdtemp(prefix="hybridflow-sandbox-")
    try:
        return _run_in(workdir, code, stdin, config, isolation, allow_forks)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_in(workdir: str, code: str, stdin: str, config: SandboxConfig, isolation: str,
            allow_forks: int) -> SandboxResult:
    with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
        f.write(code)
    spec = build_spec(config, isolation, workdir, allow_forks)
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
    launcher_rc = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    return _result(workdir, spec, isolation, launcher_rc, timed_out, usage, out, err, wall)


def _setup_error(workdir: str, reports: list[dict]) -> str | None:
    path = os.path.join(workdir, "setup_error.txt")
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path) as f:
            return f.read()
    for r in reports:
        if "setup_error" in r:
            return r["setup_error"]
    return None


def _result(workdir, spec, isolation, launcher_rc, timed_out, usage, out, err, wall) -> SandboxResult:
    reports = _read_reports(workdir)
    problem = _setup_error(workdir, reports)
    if problem is not None:
        return SandboxResult("error", None, "", f"sandbox setup failed ({isolation} mode):\n{problem}", wall,
                             isolation=isolation)
    stderr_text = err.text()
    common = dict(stdout_truncated=out.truncated, stderr_truncated=err.truncated, isolation=isolation)
    if isolation == "audit":
        status_ = _classify(launcher_rc, timed_out, usage.ru_utime + usage.ru_stime, spec["cpu_limit_s"],
                            stderr_text)
        return SandboxResult(status_, launcher_rc, out.text(), stderr_text, wall, **common)
    final = next((r for r in reversed(reports) if "exit" in r or "signal" in r), None)
    if final is None:
        if timed_out:
            return SandboxResult("timeout", None, out.text(), stderr_text, wall, **common)
        return SandboxResult("error", None, out.text(),
                             f"sandbox ({isolation} mode) ended without a report (launcher exit code "
                             f"{launcher_rc}):\n{stderr_text}", wall, **common)
    returncode = final["exit"] if "exit" in final else -int(final["signal"])
    peak = float(final.get("peak_mb", 0.0))
    if final.get("event") == "memory":
        note = f"\n[sandbox: killed: the run's processes used over {spec['memory_mb']} MiB together]"
        return SandboxResult("memory", returncode, out.text(), stderr_text + note, wall, peak_memory_mb=peak,
                             **common)
    if final.get("event") == "processes":
        note = (f"\n[sandbox: killed: more than {spec['max_processes']} processes "
                f"({final.get('peak_processes')} seen)]")
        return SandboxResult("fail", returncode, out.text(), stderr_text + note, wall, peak_memory_mb=peak,
                             **common)
    status_ = _classify(returncode, timed_out, float(final.get("cpu_s", 0.0)), spec["cpu_limit_s"], stderr_text)
    return SandboxResult(status_, returncode, out.text(), stderr_text, wall, peak_memory_mb=peak, **common)


__all__ = ["execute", "python_executable", "readonly_paths"]
