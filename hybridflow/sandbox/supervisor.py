"""PID 1 of a sandboxed run's PID namespace (stdlib only; run inside the sandbox as
``python -I -S /.hf/supervisor.py /.hf/spec.json REPORT_FD``; never imported by hybridflow; the launcher loads
it by path in ``audit`` mode for :func:`apply_limits`, the one definition of the programs' resource limits).

It starts the program and watches the whole namespace, because some limits only make sense over all the
processes of a run, and a per-process ``RLIMIT_AS`` lets N forks use N times the memory:

* **memory summed over processes**: every ``poll_s`` (10 ms) it adds up the anonymous resident memory of
  every process of the namespace (``/proc/<pid>/statm``: resident minus file-backed/shared pages) and kills
  them all when the sum passes ``memory_mb``;
* **process count**: kills them all when there are more than ``max_processes`` (the kernel's
  ``RLIMIT_NPROC`` is the first line; this one also holds where the kernel does not count, e.g. uid 0);
* **reaping**: as the namespace's init it reaps orphans, and when the program exits it kills whatever the
  program left running, so nothing outlives the run.

The program cannot signal it (the kernel ignores signals sent to a namespace init from inside unless it has a
handler, and SIGKILL always), cannot read its memory (it is not dumpable, and ``ptrace`` is refused by the
seccomp filter), and cannot write to its report, a file descriptor it closes before starting the program.
The report is one JSON line: ``{"exit": code}`` or ``{"signal": n}``, ``"event"`` (``"memory"`` or
``"processes"`` when it killed the run), ``"peak_mb"`` and ``"cpu_s"``; or ``{"setup_error": text}``.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time
import traceback

PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _prctl(libc, *args):
    args = args + (0,) * (5 - len(args))
    if libc.prctl(*[ctypes.c_ulong(a) if isinstance(a, int) else a for a in args]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl{args[:2]}: {os.strerror(err)}")


def _load_seccomp(libc, path):
    with open(path, "rb") as f:
        program = f.read()
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    _prctl(libc, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog))


def rlimits(spec):
    """{resource: (soft, hard)} every sandboxed program runs under, in every mode: CPU time (SIGXCPU at the soft
    limit, SIGKILL a second later), address space, file size, open files, no core dumps."""
    cpu, mem, fsize = spec["cpu_limit_s"], spec["memory_mb"] * 1024 * 1024, spec["disk_mb"] * 1024 * 1024
    return {resource.RLIMIT_CPU: (cpu, cpu + 1), resource.RLIMIT_AS: (mem, mem),
            resource.RLIMIT_FSIZE: (fsize, fsize),
            resource.RLIMIT_NOFILE: (spec["max_open_files"], spec["max_open_files"]),
            resource.RLIMIT_CORE: (0, 0)}


def apply_limits(spec):
    """Set :func:`rlimits` on this process (the one place they are set: the OS modes' supervisor calls it before
    starting the program, the launcher's ``audit`` mode loads this file and calls it too)."""
    for which, limits in rlimits(spec).items():
        resource.setrlimit(which, limits)


def _exec_program(spec, libc):
    """(the forked child) limits, no new privileges, the seccomp filter, then the program."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    apply_limits(spec)
    _prctl(libc, PR_SET_NO_NEW_PRIVS, 1)
    if spec.get("seccomp_inner"):
        _load_seccomp(libc, spec["seccomp_inner"])
    python = spec["python"]
    os.execve(python, [python, "-I", "-B", "main.py"], spec["env"])


def _usage(me, page):
    """(anonymous resident bytes summed over the namespace's processes, number of processes), except ours."""
    total = count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/statm", "rb") as f:
                fields = f.read().split()
        except OSError:
            continue  # exited meanwhile
        count += 1
        if len(fields) >= 3:
            total += max(0, int(fields[1]) - int(fields[2])) * page
    return total, count


def _reap(child, status):
    """Reap every exited process; returns the program's wait status once it has exited."""
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == child:
            status = st


def _kill_all():
    """SIGKILL every process of the namespace (init excepted) and reap them (bounded wait)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _watch(spec, child):
    limit = spec["memory_mb"] * 1024 * 1024
    max_procs = spec["max_processes"]
    interval = float(spec.get("poll_s", 0.01))
    page = os.sysconf("SC_PAGE_SIZE")
    me = os.getpid()
    peak, peak_procs, event, status = 0, 0, None, None
    while True:
        status = _reap(child, status)
        if status is not None:
            break
        used, count = _usage(me, page)
        peak, peak_procs = max(peak, used), max(peak_procs, count)
        if count > max_procs:
            event = "processes"
            break
        if used > limit:
            event = "memory"
            break
        signal.sigtimedwait({signal.SIGCHLD}, interval)
    _kill_all()
    status = _reap(child, status)
    record = {"event": event, "peak_mb": round(peak / 2**20, 1), "peak_processes": peak_procs}
    if status is None:  # killed by us before it exited
        record["signal"] = signal.SIGKILL
    elif os.WIFSIGNALED(status):
        record["signal"] = os.WTERMSIG(status)
    else:
        record["exit"] = os.waitstatus_to_exitcode(status)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    record["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
    return record


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    report_fd = int(sys.argv[2])
    os.set_inheritable(report_fd, False)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    libc = ctypes.CDLL(None, use_errno=True)
    _prctl(libc, PR_SET_DUMPABLE, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    child = os.fork()
    if child == 0:
        try:
            _exec_program(spec, libc)  # the report descriptor is close-on-exec: the program never has it
        except BaseException:
            os.write(report_fd, (json.dumps({"setup_error": traceback.format_exc()}) + "\n").encode())
        os._exit(125)
    record = _watch(spec, child)
    os.write(report_fd, (json.dumps(record) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
