"""Scoring functions that misbehave the ways an independent probe found (issue 34), for test_reward_workers.py.

Each takes verl's signature; ``extra_info`` carries what the test wants (a folder to record into, sizes)."""

import os
import subprocess
import sys
import time

_KEPT = []  # what the leaking scorer never lets go


def leak(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Keeps ``extra_info['mb']`` MiB per call (touched, so resident)."""
    _KEPT.append(bytearray(os.urandom(1024)) * (extra_info["mb"] * 1024))
    return {"score": 1.0, "pid": os.getpid()}


def balloon(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Grows inside one call and keeps going (a scorer stuck building a huge structure)."""
    block = []
    while True:
        block.append(bytearray(32 * 1024 * 1024))
        time.sleep(0.05)


def detach(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Starts a child in a new session and a double-forked grandchild whose parent exits; records their pids."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    reader, writer = os.pipe()
    middle = os.fork()
    if middle == 0:  # the classic daemon: fork, setsid, fork again, the middle one exits
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)"])
        os.write(writer, str(grandchild).encode())
        os._exit(0)
    os.waitpid(middle, 0)
    daemon = int(os.read(reader, 32))
    with open(os.path.join(extra_info["folder"], f"pids-{os.getpid()}-{child.pid}"), "w") as f:
        f.write(f"{child.pid} {daemon}")
    return 1.0


def hang(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Records when it started, then never returns."""
    with open(os.path.join(extra_info["folder"], f"start-{extra_info['i']}"), "w") as f:
        f.write(repr(time.monotonic()))
    while True:
        time.sleep(1)
