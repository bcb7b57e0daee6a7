# The program the launcher runs with ``python -I -B -c`` in ``audit`` mode (never imported by hybridflow).
#
# It installs a PEP 578 audit hook, then runs ``main.py``. The hook is hardened against the program it polices:
# * its state is closure cells of immutable objects (frozensets, tuples, strings, C functions captured before the
#   program runs) plus an ``itertools.count`` that can only move forwards. The helpers it calls are the functions
#   below; they read no global and no builtin at run time (everything they use is a default argument bound at
#   definition), hold no closure, and setting their ``__code__``/``__defaults__`` is refused. No frame, module or
#   global holds a reference to the hook, so walking frames up to this bootstrap and patching ``os``,
#   ``os.path`` or ``builtins`` changes nothing it uses;
# * the ways to reach arbitrary objects are refused: the ``gc`` object walkers, ``sys._current_frames`` /
#   ``_current_exceptions`` (another thread's frame inside the hook), ``sys.settrace``/``setprofile``;
# * paths are resolved as the kernel resolves them (every symbolic link followed, ``..`` applied to the real
#   directory, ``/proc/self/fd/N`` read for a descriptor), then checked against the real working directory. The
#   hook cannot see the ``dir_fd`` of an ``open``, so a directory handle outside the working directory is
#   refused and a relative path given to ``open`` may not climb above its own start; the other calls name their
#   ``dir_fd`` and are resolved through it. Device nodes other than the four standard ones are refused (root
#   could ``mknod`` the disk, and ``mknod`` raises no audit event).
# The line below is rewritten by the launcher: how many ``os.fork`` calls are allowed (1 for the code-reward
# harness, which forks once before any untrusted code runs; 0 otherwise).
import os as _os

_ALLOW_FORKS = __HF_ALLOW_FORKS__
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_WRITE_FLAGS = _os.O_WRONLY | _os.O_RDWR | _os.O_APPEND | _os.O_CREAT | _os.O_TRUNC
# event -> ((index of a path argument, index of its dir_fd argument or -1), ...) for the calls that change files
_WRITES = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.truncate": ((0, -1),), "os.rename": ((0, 2), (1, 3)),
    "os.setxattr": ((0, -1),), "os.removexattr": ((0, -1),), "shutil.copyfile": ((0, -1), (1, -1)),
    "shutil.copymode": ((0, -1), (1, -1)), "shutil.copystat": ((0, -1), (1, -1)),
    "shutil.copytree": ((0, -1), (1, -1)), "shutil.move": ((0, -1), (1, -1)), "shutil.rmtree": ((0, 1),),
    "shutil.chown": ((0, -1),), "shutil.unpack_archive": ((0, -1), (1, -1)),
}
_DENIED_EVENTS = frozenset({
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.forkpty", "subprocess.Popen", "pty.spawn",
    "os.kill", "os.killpg", "signal.pthread_kill", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
    "os.symlink", "os.link", "os.setuid", "os.chroot", "resource.setrlimit", "sys.addaudithook",
    "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.fchdir", "os.chflags", "os.lchflags",
})
_DENIED_IMPORTS = frozenset({"_ctypes", "ctypes", "_posixsubprocess", "cffi", "_xxsubinterpreters",
                             "_testcapi", "_testinternalcapi", "_testmultiphase"})
_LISTS = {"os.listdir": ((0, -1),), "os.scandir": ((0, -1),)}  # the import system lists the stdlib's dirs


def _refuse(why, _PermissionError=PermissionError):
    raise _PermissionError("sandbox: " + why)


def _fd_path(fd, _readlink=_os.readlink, _str=str, _OSError=OSError, _refuse=_refuse):
    """The path the kernel holds for descriptor ``fd`` of this process."""
    try:
        return _readlink("/proc/self/fd/" + _str(fd))
    except _OSError:
        _refuse("cannot tell which file descriptor " + _str(fd) + " is")


def _as_text(path, _type=type, _str=str, _bytes=bytes, _decode=bytes.decode, _refuse=_refuse):
    """A path argument as exact ``str`` (bytes decoded as the kernel sees them), anything else refused."""
    if _type(path) is _str:
        return path
    if _type(path) is _bytes:
        return _decode(path, "utf-8", "surrogateescape")
    _refuse("paths must be str or bytes")


def _real_path(path, base, _lstat=_os.lstat, _readlink=_os.readlink, _OSError=OSError, _refuse=_refuse):
    """``path`` (relative to ``base``) with every symbolic link followed and ``..`` applied to real directories."""
    pending = path.split("/")
    pending.reverse()
    parts = [] if path.startswith("/") else [p for p in base.split("/") if p]
    links = 0
    while pending:
        part = pending.pop()
        if part == "" or part == ".":
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        here = "/" + "/".join(parts + [part])
        try:
            is_link = (_lstat(here).st_mode & 0o170000) == 0o120000
        except _OSError:
            is_link = False  # missing: the rest is taken as written (the kernel fails or creates it here)
        if not is_link:
            parts.append(part)
            continue
        links += 1
        if links > 40:
            _refuse("too many symbolic links in " + path)
        target = _readlink(here).split("/")
        target.reverse()
        pending.extend(target)
        if target and target[-1] == "":  # absolute target: start again from /
            parts = []
    return "/" + "/".join(parts)


def _climbs(path):
    """True when relative ``path`` goes above the directory it starts from (``..`` past its own components)."""
    depth = 0
    for part in path.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part != "" and part != ".":
            depth += 1
    return False


def _inside(path, roots):
    for root in roots:
        if path == root or path.startswith(root + "/"):
            return True
    return False


def _resolve(arg, dir_fd, _getcwd=_os.getcwd, _type=type, _int=int, _fd_path=_fd_path, _as_text=_as_text,
             _real_path=_real_path):
    """The real path a call with ``arg`` (path or descriptor) and ``dir_fd`` (-1/None: none) reaches."""
    if _type(arg) is _int:
        return _fd_path(arg)
    if arg is None:
        arg = "."
    path = _as_text(arg)
    if path.startswith("/"):
        return _real_path(path, "/")
    base = _fd_path(dir_fd) if _type(dir_fd) is _int and dir_fd >= 0 else _getcwd()
    return _real_path(path, base)


def _check(path, roots, what, _inside=_inside, _refuse=_refuse):
    if not _inside(path, roots):
        _refuse(what + " " + path + " outside the working directory is not allowed")


def _check_open(args, work, readable, _type=type, _int=int, _str=str, _stat=_os.stat, _OSError=OSError,
                _write_flags=_WRITE_FLAGS, _devices=_DEVICES, _as_text=_as_text, _climbs=_climbs, _resolve=_resolve,
                _check=_check, _inside=_inside, _refuse=_refuse):
    """``open`` (builtin and ``os.open``): the path is checked; its ``dir_fd`` is not in the event."""
    if _type(args[0]) is _int:
        return  # wrapping a descriptor this process already has
    flags = args[2] if _type(args[2]) is _int else 0
    mode = args[1] if _type(args[1]) is _str else ""
    writing = (flags & _write_flags) != 0 or "w" in mode or "a" in mode or "x" in mode or "+" in mode
    raw = _as_text(args[0])
    if not raw.startswith("/") and _climbs(raw):
        _refuse("relative paths that climb above their start ('../') cannot be opened in audit mode (its hook "
                "cannot see a dir_fd): use an absolute path")
    path = _resolve(raw, -1)
    _check(path, work if writing else readable, "writing" if writing else "access to")
    try:
        kind = _stat(path).st_mode & 0o170000
    except _OSError:
        return
    if kind == 0o040000 and not _inside(path, work):
        _refuse("a directory handle outside the working directory is not allowed (" + path + ")")
    if (kind == 0o020000 or kind == 0o060000) and path not in _devices:
        _refuse("device " + path + " is not allowed")


def _check_args(args, positions, roots, what, advisory=False, _len=len, _type=type, _str=str, _bytes=bytes,
                _int=int, _resolve=_resolve, _check=_check):
    """Check the path arguments of an event; ``advisory`` events (``shutil.*``) announce calls whose own ``open``
    and ``os.*`` events follow with plain paths, so their path-like objects are left to those."""
    for index, fd_index in positions:
        if index < _len(args):
            kind = _type(args[index])
            if advisory and kind is not _str and kind is not _bytes and kind is not _int:
                continue
            dir_fd = args[fd_index] if 0 <= fd_index < _len(args) else -1
            _check(_resolve(args[index], dir_fd), roots, what)


def _make_hook(allow_forks):
    import itertools
    import sys

    _next, _PermissionError, _type, _str = next, PermissionError, type, str
    fork_count = itertools.count()
    work = (_real_path(_os.getcwd(), "/"),)
    prefixes = {_real_path(p, "/") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    readable = work + tuple(sorted(prefixes)) + _DEVICES
    deny, deny_imports = _DENIED_EVENTS, _DENIED_IMPORTS  # frozensets
    helpers = (_refuse, _fd_path, _as_text, _real_path, _climbs, _inside, _resolve, _check, _check_open, _check_args)
    write_events, writes, lists = frozenset(_WRITES), tuple(_WRITES.items()), tuple(_LISTS.items())  # immutable
    check_open, check_args = _check_open, _check_args

    def hook(event, args):
        if event in deny:
            raise _PermissionError("sandbox: '" + event + "' is not allowed")
        if event == "open":
            check_open(args, work, readable)
        elif event == "import":
            if _type(args[0]) is not _str or args[0].split(".")[0] in deny_imports:
                raise _PermissionError("sandbox: importing this module is not allowed")
        elif event == "os.fork":
            if _next(fork_count) >= allow_forks:
                raise _PermissionError("sandbox: 'os.fork' is not allowed")
        elif event == "os.chdir":
            check_args(args, ((0, -1),), work, "changing directory to")
        elif event == "object.__setattr__":
            for helper in helpers:
                if args[0] is helper:
                    raise _PermissionError("sandbox: the audit hook's helpers cannot be changed")
        elif event in write_events:
            for name, positions in writes:
                if event == name:
                    check_args(args, positions, work, "writing", name[:7] == "shutil.")
        else:
            for name, positions in lists:
                if event == name:
                    check_args(args, positions, readable, "listing")

    return hook


def _start():
    import sys

    sys.addaudithook(_make_hook(_ALLOW_FORKS))
    import runpy

    sys.argv = ["main.py"]
    runpy.run_path("main.py", run_name="__main__")


_start()
