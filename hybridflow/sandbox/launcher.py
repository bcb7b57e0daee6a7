"""Sandbox launcher: the first process of every sandboxed run (stdlib only, run as ``python -I -S <this file>``).

Why a separate script instead of ``subprocess.Popen(preexec_fn=...)``: ``preexec_fn`` runs Python between
``fork`` and ``exec`` in a possibly multi-threaded parent, which can deadlock (CPython documents it as unsafe
with threads), and the sandbox must be callable from many threads at once. This launcher runs in its own
fresh interpreter, so it may take locks, import modules and call ``ctypes`` freely.

It reads the JSON spec written by :mod:`hybridflow.sandbox.runner` and sets up one of four modes; in the first
three, PID 1 of the new PID namespace is ``supervisor.py`` (the memory/process watchdog, which starts the
program):

``namespace`` (root): ``unshare`` mount, network, PID, IPC and UTS namespaces; the PID-namespace init builds
a private root on a size-capped tmpfs (read-only binds of the system dirs and the Python prefix, a private
``/proc``, four device nodes, the working dir ``/sandbox``), ``chroot`` s into it, drops to a random
unprivileged uid (no capabilities left) and ``exec`` s the supervisor.

``userns`` (any user, needs unprivileged user namespaces): the same, inside a new *user* namespace too. The
launcher writes the namespace's uid/gid map from outside: the sandbox's uid 1000 is this user's uid, or a
random unprivileged uid when the launcher runs as root (so the kernel's per-uid process count is private).

``bwrap`` (bubblewrap installed): the launcher ``exec`` s ``bwrap`` with the arguments the host prepared,
passing the program, the spec, the supervisor and the seccomp filter as file descriptors. As root, it first
drops to the run's random uid when the Python installation is readable by others.

``audit`` (only when asked for by name): resource limits and a PEP 578 audit hook inside the program's own
interpreter. Best effort: see docs/sandbox.md.

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
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
# statvfs f_flag bits -> mount flags a read-only remount must keep (the kernel refuses to clear locked ones)
_KEEP_FLAGS = ((8, MS_NOEXEC), (1024, MS_NOATIME), (2048, MS_NODIRATIME), (4096, MS_RELATIME))
PR_SET_PDEATHSIG = 1
SETUP_FAILED_EXIT = 125
DEVICES = ("null", "zero", "random", "urandom")
INNER_DIR = "/.hf"

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
    keep = 0
    flags = os.statvfs(src).f_flag
    for st_bit, ms_bit in _KEEP_FLAGS:
        if flags & st_bit:
            keep |= ms_bit
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def _pdeathsig():
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def _copy_private(src, dst, uid, gid, mode):
    shutil.copyfile(src, dst)
    os.chown(dst, uid, gid)
    os.chmod(dst, mode)


def _build_root(spec, owner):
    """Populate a tmpfs root with read-only views of what the interpreter needs, and nothing else; only
    ``/sandbox``, ``/tmp`` and ``/dev/shm`` stay writable (in an unprivileged user namespace the root's own
    directories belong to the program's uid, so the read-only remount is what keeps them unwritable)."""
    root = spec["root_dir"]
    os.makedirs(root, exist_ok=True)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['disk_mb']}m,mode=755")
    _expose_system(root, spec["readonly_paths"])
    _add_devices_and_proc(root)
    for scratch in ("/tmp", "/dev/shm"):  # /dev/shm: multiprocessing's semaphores live there
        os.makedirs(root + scratch, exist_ok=True)
        _mount("tmpfs", root + scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['disk_mb']}m,mode=1777")
    _add_supervisor_files(root, spec, owner)
    work = root + "/sandbox"
    os.makedirs(work)
    _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['disk_mb']}m,mode=755")
    shutil.copyfile(os.path.join(spec["host_workdir"], "main.py"), work + "/main.py")
    os.chown(work, *owner)
    os.chown(work + "/main.py", *owner)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _expose_system(root, paths):
    """Read-only binds of the system dirs and the Python prefix (links recreated as links)."""
    for path in paths:
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


def _add_devices_and_proc(root):
    os.makedirs(root + "/dev", exist_ok=True)
    for dev in DEVICES:
        src = "/dev/" + dev
        if os.path.exists(src):
            dst = root + src
            open(dst, "a").close()
            _mount(src, dst, None, MS_BIND)
    os.makedirs(root + "/proc", exist_ok=True)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _add_supervisor_files(root, spec, owner):
    """What the supervisor reads, read-only. Owned by root where root exists in the namespace (``namespace``, or
    ``userns`` started by root); an unprivileged user namespace maps one id only, the program's (a chown to an
    id absent from the namespace fails with EINVAL): the files are then the program's own, still read-only and
    read by the supervisor before the program starts."""
    inner = root + INNER_DIR
    os.makedirs(inner)
    host = spec["host_workdir"]
    uid, gid = (0, 0) if spec["privileged"] else owner
    _copy_private(spec["supervisor_path"], inner + "/supervisor.py", uid, gid, 0o444)
    _copy_private(os.path.join(host, "spec.json"), inner + "/spec.json", uid, gid, 0o444)
    if spec.get("seccomp_path"):
        _copy_private(spec["seccomp_path"], inner + "/seccomp.bpf", uid, gid, 0o444)
    os.chmod(inner, 0o555)


def _exec_supervisor(spec, report_fd):
    os.set_inheritable(report_fd, True)
    python = spec["python"]
    os.execve(python, [python, "-I", "-S", "-B", INNER_DIR + "/supervisor.py", INNER_DIR + "/spec.json",
                       str(report_fd)], spec["env"])


def _enter_private_root(spec, report_fd, owner, become_user):
    """(PID 1 of the new namespaces) build the root, enter it, drop privileges, become the supervisor."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _build_root(spec, owner)
    os.chroot(spec["root_dir"])
    os.chdir("/sandbox")
    become_user()
    _pdeathsig()  # cleared by a change of uid, so set after it: if our parent dies, the namespace dies
    _exec_supervisor(spec, report_fd)


def _relay_exit(pid):
    """The exit code of ``pid`` (128 + signal number when it was killed)."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def _write_init_pid(spec, pid):
    with open(os.path.join(spec["host_workdir"], "init.pid"), "w") as f:
        f.write(str(pid))


def _in_child(fn, *args):
    """Run ``fn(*args)`` (which execs or exits) in this forked child; report set-up errors, never return."""
    try:
        fn(*args)
    except BaseException:
        _report_setup_error()
    os._exit(SETUP_FAILED_EXIT)


def _limit_processes(spec):
    """The kernel's per-uid process count, set before the switch to the run's own uid (OS modes only)."""
    resource.setrlimit(resource.RLIMIT_NPROC, (spec["nproc_limit"], spec["nproc_limit"]))


def _run_namespace(spec, report_fd):
    _pdeathsig()
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    uid, gid = spec["uid"], spec["gid"]

    def become_user():
        _limit_processes(spec)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # drops every capability: no remount, no chroot escape, the process count enforced

    pid = os.fork()
    if pid == 0:
        _in_child(_enter_private_root, spec, report_fd, (uid, gid), become_user)
    # The host kills the init by this pid on timeout: the kernel then kills and reaps the whole namespace
    # before our waitpid returns, so nothing outlives the host's call.
    _write_init_pid(spec, pid)
    sys.exit(_relay_exit(pid))


def _write_id_maps(pid, spec, privileged):
    """The user namespace's id maps. Unprivileged: our own uid is the sandbox's ``inner_uid`` (the only map
    the kernel allows). As root: also map root to itself, so the set-up (still uid 0) can create the private
    root's files; the switch to ``inner_uid`` (the run's random host uid) then clears every capability."""
    inner_uid, inner_gid = spec["inner_uid"], spec["inner_gid"]
    if privileged:
        uid_map = f"0 0 1\n{inner_uid} {spec['uid']} 1\n"
        gid_map = f"0 0 1\n{inner_gid} {spec['gid']} 1\n"
    else:
        uid_map, gid_map = f"{inner_uid} {os.geteuid()} 1\n", f"{inner_gid} {os.getegid()} 1\n"
        with open(f"/proc/{pid}/setgroups", "w") as f:
            f.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as f:
        f.write(uid_map)
    with open(f"/proc/{pid}/gid_map", "w") as f:
        f.write(gid_map)


def _userns_child(spec, report_fd, ready_w, go_r):
    """Creator of the user namespace: unshare, wait for the id maps, fork the PID-namespace init."""
    _pdeathsig()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS),
           "unshare (user namespace)")
    os.write(ready_w, b"u")
    if os.read(go_r, 1) != b"m":
        raise RuntimeError("the launcher could not write the user namespace's id maps")
    privileged = spec["privileged"]
    inner = (spec["inner_uid"], spec["inner_gid"])

    def become_user():
        _limit_processes(spec)
        if privileged:
            os.setgroups([])
        os.setresgid(inner[1], inner[1], inner[1])
        os.setresuid(inner[0], inner[0], inner[0])  # the exec that follows drops the namespace's capabilities

    pid = os.fork()
    if pid == 0:
        _in_child(_enter_private_root, spec, report_fd, inner, become_user)
    _write_init_pid(spec, pid)
    os._exit(_relay_exit(pid))


def _run_userns(spec, report_fd):
    _pdeathsig()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        _in_child(_userns_child, spec, report_fd, ready_w, go_r)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"u":
        try:
            _write_id_maps(pid, spec, spec["privileged"])
            os.write(go_w, b"m")
        except BaseException:
            _report_setup_error()
    os.close(go_w)
    sys.exit(_relay_exit(pid))


def _run_bwrap(spec, report_fd):
    """Open the files bwrap copies into the sandbox, drop privileges if planned, exec bwrap."""
    host = spec["host_workdir"]
    fds = {"report_fd": report_fd,  # bwrap writes {"child-pid": N} to info: the sandbox init's host pid
           "info_fd": os.open(os.path.join(host, "bwrap-info.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)}
    os.set_inheritable(fds["info_fd"], True)
    for key, path in (("main_fd", os.path.join(host, "main.py")), ("spec_fd", os.path.join(host, "spec.json")),
                      ("supervisor_fd", spec["supervisor_path"]), ("seccomp_fd", spec.get("seccomp_path"))):
        if path:
            fds[key] = os.open(path, os.O_RDONLY)
            os.set_inheritable(fds[key], True)
    os.set_inheritable(report_fd, True)
    argv = [arg.format(**fds) for arg in spec["bwrap_argv"]]
    if spec.get("bwrap_as_uid"):
        os.setgroups([])
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
    os.chdir("/")
    _pdeathsig()
    os.execve(argv[0], argv, {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})


def _apply_limits(spec):
    """The programs' resource limits, as the supervisor sets them in the OS modes (one definition: it is loaded
    from the supervisor's file; RLIMIT_NPROC is left out here, it would count all the host user's processes)."""
    import importlib.util

    module_spec = importlib.util.spec_from_file_location("hybridflow_sandbox_supervisor", spec["supervisor_path"])
    supervisor = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(supervisor)
    supervisor.apply_limits(spec)


def _run_audit(spec, report_fd):
    os.close(report_fd)
    work = os.path.join(spec["host_workdir"], "work")
    os.makedirs(work, exist_ok=True)
    shutil.copy(os.path.join(spec["host_workdir"], "main.py"), work + "/main.py")
    os.chdir(work)
    _apply_limits(spec)
    env = dict(spec["env"], HOME=work, TMPDIR=work)
    with open(spec["audit_bootstrap_path"]) as f:
        bootstrap = f.read()
    bootstrap = bootstrap.replace("__HF_ALLOW_FORKS__", str(int(spec.get("allow_forks", 0))))
    os.execve(spec["python"], [spec["python"], "-I", "-B", "-c", bootstrap], env)


_error_fd = -1  # opened before chroot (close-on-exec), so a namespace child can still report


def _report_setup_error():
    try:
        os.write(_error_fd, traceback.format_exc().encode("utf-8", "replace"))
    except OSError:
        pass


_MODES = {"namespace": _run_namespace, "userns": _run_userns, "bwrap": _run_bwrap, "audit": _run_audit}


def main():
    global _error_fd
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    host = spec["host_workdir"]
    _error_fd = os.open(os.path.join(host, "setup_error.txt"), os.O_WRONLY | os.O_CREAT, 0o600)
    report_fd = os.open(os.path.join(host, "report.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        _MODES[spec["isolation"]](spec, report_fd)
    except SystemExit:
        raise
    except BaseException:
        _report_setup_error()
        sys.exit(SETUP_FAILED_EXIT)


if __name__ == "__main__":
    main()
