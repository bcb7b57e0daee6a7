"""Entry point of a scoring worker process (see :mod:`hybridflow.rewards.pool`).

Protocol over two pipes given as file descriptors: the parent sends the :class:`ScoreFnSpec`, the worker
answers ``("ready", None)`` (or ``("init_error", traceback)``), then serves ``(index, kwargs)`` tasks with
``(index, "ok", value)`` / ``(index, "error", traceback)`` until it receives ``None`` or the pipe closes; it
then kills every process its scorer started (``proc_tree``: it is their subreaper) before it exits.
"""

from __future__ import annotations

import os
import sys
import traceback
import types
from multiprocessing.connection import Connection


def _light_package() -> None:
    """Register ``hybridflow`` without running its ``__init__`` (which imports torch: 3-10 s per worker).

    Scorers are pure Python; paying a torch import for every (re)started worker would make a timed-out
    sample cost seconds of start-up. Package attributes still work: the first one asked for runs the real
    ``__init__`` into the same module object.
    """
    pkg_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    init_file = os.path.join(pkg_dir, "__init__.py")
    pkg = types.ModuleType("hybridflow")
    pkg.__path__ = [pkg_dir]
    pkg.__file__ = init_file

    def __getattr__(name: str):
        del pkg.__getattr__  # run the real __init__ once
        with open(init_file, encoding="utf-8") as f:
            exec(compile(f.read(), init_file, "exec"), pkg.__dict__)
        if name in pkg.__dict__:
            return pkg.__dict__[name]
        raise AttributeError(f"module 'hybridflow' has no attribute '{name}'")

    pkg.__getattr__ = __getattr__
    sys.modules.setdefault("hybridflow", pkg)


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run as a script: this folder's modules must not shadow top-level names
    _light_package()

from hybridflow.rewards.custom_function import call_score_fn  # noqa: E402
from hybridflow.rewards.pool import ERROR, OK, run_tasks_concurrently  # noqa: E402
from hybridflow.rewards.proc_tree import become_subreaper, kill_descendants, reap_children  # noqa: E402


def serve_and_clean_up(recv: Connection, send: Connection) -> None:
    """Serve until told to stop (or the parent is gone), then end every process the scorer started, detached
    ones included: as a subreaper this worker has inherited them."""
    become_subreaper()
    try:
        serve(recv, send)
    finally:
        kill_descendants(os.getpid())
        reap_children()


def serve(recv: Connection, send: Connection) -> None:
    try:
        fn = recv.recv().resolve()
    except BaseException:
        send.send(("init_error", traceback.format_exc()))
        return
    send.send(("ready", None))
    while True:
        try:
            msg = recv.recv()
        except EOFError:
            return
        if msg is None:
            return
        if msg[0] == "batch":  # a coroutine scorer's share of the batch, run concurrently
            results = run_tasks_concurrently(fn, msg[1], msg[2])
            replies = [(idx, *result) for (idx, _), result in zip(msg[1], results)]
            try:
                send.send(("batch", [(i, status, value if status == OK else error) for i, status, value, error in replies]))
            except Exception:
                send.send(("batch", [(i, ERROR, f"unpicklable result:\n{traceback.format_exc()}") for i, *_ in replies]))
            continue
        idx, kwargs = msg
        try:
            reply = (idx, OK, call_score_fn(fn, kwargs))
        except BaseException:
            reply = (idx, ERROR, traceback.format_exc())
        try:
            send.send(reply)
        except Exception:  # an unpicklable return value: report it instead of dying
            send.send((idx, ERROR, f"reward function returned an unpicklable value:\n{traceback.format_exc()}"))


if __name__ == "__main__":
    read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
    serve_and_clean_up(Connection(read_fd, writable=False), Connection(write_fd, readable=False))
