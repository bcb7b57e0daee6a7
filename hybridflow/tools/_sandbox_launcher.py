"""Sandbox launcher: the first process of every sandboxed run (stdlib only, run as ``python -I -S <this file>``).

Why a separate script instead of ``subprocess.Popen(preexec_fn=...)``: ``preexec_fn`` runs Python between
``fork`` and ``exec`` in a possibly multi-threaded parent, which can deadlock (CPython documents it as unsafe
with threads) — and the sandbox must be callable from many threads at once. This launcher runs in its own
fresh interpreter, so it may take locks, import modules and call ``ctypes`` freely.

It reads a JSON spec written by :mod:`hybridflow.tools.sandbox` and applies one of two isolation modes:

``namespace`` (needs root / CAP_SYS_ADMIN): ``unshare`` new mount, network, PID, IPC and UTS namespaces,
fork the PID-namespace init, build a minimal root on a size-limited tmpfs (read-only binds of the system
directories and the Python prefix, a private ``/proc``, four device nodes, the working dir ``/sandbox``),
``chroot`` into it, set resource limits, drop every privilege by switching to a dedicated unprivileged uid, and
``exec`` Python on the user code. When the init dies the kernel kills every process of the namespace, and the
init gets SIGKILL when this launcher dies (``PR_SET_PDEATHSIG``), so one ``killpg`` from the host reaps all.

``audit`` (fallback when namespaces are not permitted): resource limits (no process-count limit: it would be
shared with the host's uid) and an in-interpreter audit hook (PEP 578) that refuses sockets, process creation,
signals, ``ctypes`` and file access outside the working dir. Best effort only: see docs/sandbox.md.

Errors while setting up are written to ``<spec dir>/setup_error.txt`` (unreachable from the sandboxed code),
so the host can tell a broken sandbox from a failing program.
"""

import ctypes
import json
import os
import resource
import shutil
import signal
import sys
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
SETUP_FAILED_EXIT = 125
DEVICES = ("null", "zero", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    ret = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount {source} -> {target}")


def _bind_readonly(src, dst):
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount(src, dst, None, MS_BIND | MS_REC)
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _set_limits(spec):
    """RLIMIT_CPU (soft then SIGKILL 1 s later), RLIMIT_AS, file size, open files, no core dumps."""
    cpu = spec["cpu_limit_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = spec["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = spec["disk_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (spec["max_open_files"], spec["max_open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _build_root(spec):
    """Populate a tmpfs root with read-only views of what the interpreter needs, and nothing else."""
    root = spec["root_dir"]
    os.makedirs(root, exist_ok=True)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['disk_mb']}m,mode=755")
    for path in spec["readonly_paths"]:
        if os.path.realpath(path) == "/":
            raise ValueError("refusing to expose the host's / inside the sandbox")
        if not os.path.lexists(path):
            continue
        dst = root + path
        if os.path.islink(path):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if not os.path.lexists(dst):
                os.symlink(os.readlink(path), dst)
            continue
        _bind_readonly(path, dst)
    os.makedirs(root + "/dev", exist_ok=True)
    for dev in DEVICES:
        src = "/dev/" + dev
        if os.path.exists(src):
            dst = root + src
            open(dst, "a").close()
            _mount(src, dst, None, MS_BIND)
    os.makedirs(root + "/proc", exist_ok=True)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for scratch in ("/tmp", "/dev/shm"):  # /dev/shm: multiprocessing's semaphores live there
        os.makedirs(root + scratch, exist_ok=True)
        os.chmod(root + scratch, 0o1777)
    work = root + "/sandbox"
    os.makedirs(work)
    shutil.copy(os.path.join(spec["host_workdir"], "main.py"), work + "/main.py")
    for dirpath, _, files in os.walk(work):
        os.chown(dirpath, spec["uid"], spec["gid"])
        for f in files:
            os.chown(os.path.join(dirpath, f), spec["uid"], spec["gid"])


def _namespace_child(spec):
    """PID 1 of the new namespaces: build the root, drop privileges, exec the user program."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _build_root(spec)
    os.chroot(spec["root_dir"])
    os.chdir("/sandbox")
    _set_limits(spec)
    nproc = spec["max_processes"]
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    os.setgroups([])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])  # drops every capability: no remount, no chroot escape, NPROC enforced
    # Cleared by setuid, so set after it: if the launcher dies, this init (and its namespace) dies too.
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    os.execve(spec["python"], [spec["python"], "-I", "-B", "main.py"], spec["env"])


def _relay_exit(pid):
    """Mirror the child's fate so the host sees the program's own exit code or signal."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status)


def _run_namespace(spec):
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    _check(_libc.unshare(flags), "unshare")
    pid = os.fork()
    if pid == 0:
        try:
            _namespace_child(spec)
        except BaseException:
            _report_setup_error(spec)
        os._exit(SETUP_FAILED_EXIT)
    # The host kills the init by this pid on timeout: the kernel then kills and reaps the whole namespace
    # before our waitpid returns, so nothing outlives the host's call.
    with open(os.path.join(spec["host_workdir"], "init.pid"), "w") as f:
        f.write(str(pid))
    sys.exit(_relay_exit(pid))


AUDIT_BOOTSTRAP = r'''
import os, sys
_WORK = os.path.abspath(os.getcwd())
_READ_OK = tuple({os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)})
_READ_OK += ("/dev/null", "/dev/urandom", "/dev/random", "/dev/zero")
_DENY = {"socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
         "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
         "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "ctypes.dlopen", "ctypes.dlsym",
         "ctypes.cdata", "os.symlink", "os.link", "os.setuid", "os.chroot", "resource.setrlimit",
         "sys.addaudithook"}
_DENY_IMPORTS = {"_ctypes", "ctypes", "_posixsubprocess", "cffi"}
_WRITE_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                 "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_ap = os.path.abspath
def _inside(path, roots):
    p = _ap(os.fsdecode(path))
    return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)
def _hook(event, args):
    if event in _DENY:
        raise PermissionError(f"sandbox: '{event}' is not allowed")
    if event == "import" and args[0].split(".")[0] in _DENY_IMPORTS:
        raise PermissionError(f"sandbox: importing '{args[0]}' is not allowed")
    if event == "open" and not isinstance(args[0], int):
        flags = args[2] if isinstance(args[2], int) else 0
        mode = args[1] if isinstance(args[1], str) else ""
        writing = bool(flags & _WRITE_FLAGS) or any(c in mode for c in "wax+")
        if not _inside(args[0], (_WORK,) if writing else (_WORK,) + _READ_OK):
            raise PermissionError(f"sandbox: access to {args[0]!r} outside the working directory is not allowed")
    elif event in _WRITE_EVENTS or event in ("os.listdir", "os.scandir"):
        roots = (_WORK,) if event in _WRITE_EVENTS else (_WORK,) + _READ_OK  # the import system lists stdlib dirs
        for a in args:
            if isinstance(a, (str, bytes)) and not _inside(a, roots):
                raise PermissionError(f"sandbox: access to {a!r} outside the working directory is not allowed")
sys.addaudithook(_hook)
del _hook
import runpy
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
'''


def _run_audit(spec):
    work = os.path.join(spec["host_workdir"], "work")
    os.makedirs(work, exist_ok=True)
    shutil.copy(os.path.join(spec["host_workdir"], "main.py"), work + "/main.py")
    os.chdir(work)
    _set_limits(spec)
    env = dict(spec["env"], HOME=work, TMPDIR=work)
    os.execve(spec["python"], [spec["python"], "-I", "-B", "-c", AUDIT_BOOTSTRAP], env)


_error_fd = -1  # opened before chroot (close-on-exec), so the namespace child can still report


def _report_setup_error(spec):
    try:
        os.write(_error_fd, traceback.format_exc().encode("utf-8", "replace"))
    except OSError:
        pass


def main():
    global _error_fd
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    _error_fd = os.open(os.path.join(spec["host_workdir"], "setup_error.txt"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        if spec["isolation"] == "namespace":
            _run_namespace(spec)
        else:
            _run_audit(spec)
    except SystemExit:
        raise
    except BaseException:
        _report_setup_error(spec)
        sys.exit(SETUP_FAILED_EXIT)


if __name__ == "__main__":
    main()
