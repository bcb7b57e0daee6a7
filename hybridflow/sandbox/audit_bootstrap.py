# The program the launcher runs with ``python -I -B -c`` in ``audit`` mode (never imported by hybridflow).
#
# It installs a PEP 578 audit hook, then runs ``main.py``. The hook is hardened against the program it polices:
# * it is one function whose state is closure cells of immutable objects (frozensets, tuples, strings, C
#   functions captured before the program runs) plus an ``itertools.count`` that can only move forwards. No
#   frame, module or global holds a reference to it, and it calls no Python function, so walking frames up to
#   this bootstrap (or into the hook itself, from a signal handler) and patching ``os``, ``os.path`` or
#   ``builtins`` changes nothing it uses;
# * the ways to reach arbitrary objects are refused: the ``gc`` object walkers, ``sys._current_frames`` /
#   ``_current_exceptions`` (another thread's frame inside the hook), ``sys.settrace``/``setprofile``;
# * paths are checked only as exact ``str``/``bytes`` against the real current directory (an object whose
#   ``__fspath__`` answers differently the second time, or a ``chdir`` outside, gains nothing).
# The line below is rewritten by the launcher: how many ``os.fork`` calls are allowed (1 for the code-reward
# harness, which forks once before any untrusted code runs; 0 otherwise).
_ALLOW_FORKS = __HF_ALLOW_FORKS__


def _make_hook(allow_forks):
    import itertools
    import os
    import sys

    _getcwd, _fsdecode, _type, _str, _bytes, _int, _len = os.getcwd, os.fsdecode, type, str, bytes, int, len
    _PermissionError, _next = PermissionError, next
    fork_count = itertools.count()
    work = _getcwd()
    read_ok = tuple(sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})) + (
        "/dev/null", "/dev/urandom", "/dev/random", "/dev/zero")
    deny = frozenset({
        "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.forkpty", "subprocess.Popen", "pty.spawn",
        "os.kill", "os.killpg", "signal.pthread_kill", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
        "os.symlink", "os.link", "os.setuid", "os.chroot", "resource.setrlimit", "sys.addaudithook",
        "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.fchdir", "os.chflags", "os.lchflags",
    })
    deny_imports = frozenset({"_ctypes", "ctypes", "_posixsubprocess", "cffi", "_xxsubinterpreters",
                              "_testcapi", "_testinternalcapi", "_testmultiphase"})
    write_events = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                              "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"})
    list_events = frozenset({"os.listdir", "os.scandir"})
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    only_work = (work,)
    work_or_python = (work,) + read_ok

    def hook(event, args):
        if event in deny:
            raise _PermissionError("sandbox: '" + event + "' is not allowed")
        if event == "os.fork":
            if _next(fork_count) >= allow_forks:
                raise _PermissionError("sandbox: 'os.fork' is not allowed")
            return
        if event == "import":
            name = args[0]
            if _type(name) is not _str or name.split(".")[0] in deny_imports:
                raise _PermissionError("sandbox: importing this module is not allowed")
            return
        if event == "open":
            if _type(args[0]) is _int:
                return
            flags = args[2] if _type(args[2]) is _int else 0
            mode = args[1] if _type(args[1]) is _str else ""
            writing = (flags & write_flags) != 0 or "w" in mode or "a" in mode or "x" in mode or "+" in mode
            paths, roots = (args[0],), only_work if writing else work_or_python
        elif event == "os.chdir":
            paths, roots = (args[0],), only_work
        elif event in write_events:
            paths, roots = args, only_work
        elif event in list_events:
            paths, roots = args, work_or_python  # the import system lists the stdlib's directories
        else:
            return
        for path in paths:
            if _type(path) is _bytes:
                path = _fsdecode(path)
            elif _type(path) is not _str:
                if event in write_events or event in list_events:
                    continue  # e.g. mode bits, dir_fd
                raise _PermissionError("sandbox: paths must be str or bytes")
            if not path.startswith("/"):
                path = _getcwd() + "/" + path
            parts = []
            for part in path.split("/"):
                if part == "" or part == ".":
                    continue
                if part == "..":
                    if parts:
                        parts.pop()
                    continue
                parts.append(part)
            path = "/" + "/".join(parts)
            allowed = False
            for root in roots:
                if path == root or path.startswith(root.rstrip("/") + "/"):
                    allowed = True
            if not allowed:
                raise _PermissionError("sandbox: access to " + path + " outside the working directory is not allowed")

    return hook


def _start():
    import sys

    sys.addaudithook(_make_hook(_ALLOW_FORKS))
    import runpy

    sys.argv = ["main.py"]
    runpy.run_path("main.py", run_name="__main__")


_start()
