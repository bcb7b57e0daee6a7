"""Entry point of a scoring worker process (see :mod:`hybridflow.rewards.pool`).

Protocol over two pipes given as file descriptors: the parent sends the :class:`ScoreFnSpec`, the worker
answers ``("ready", None)`` (or ``("init_error", traceback)``), then serves ``(index, kwargs)`` tasks with
``(index, "ok", value)`` / ``(index, "error", traceback)`` until it receives ``None`` or the pipe closes.
"""

from __future__ import annotations

import sys
import traceback
from multiprocessing.connection import Connection

from hybridflow.rewards.custom import call_score_fn
from hybridflow.rewards.pool import ERROR, OK


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
    serve(Connection(read_fd, writable=False), Connection(write_fd, readable=False))
