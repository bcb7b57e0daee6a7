"""The processes a scoring worker leaves behind, found and ended (stdlib only: scoring workers import it).

Reward code may start processes and detach them (a new session, a double fork): 32 of them outlived a run
(issue 34). A scoring worker makes itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so whatever its
scorer starts and orphans is re-parented to the worker instead of init and stays in its process tree; the tree
is then killed when the worker ends (its own exit, or the pool killing it).
"""

from __future__ import annotations

import os
import signal

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Keep orphaned descendants in this process's tree (Linux); False where the kernel has no such option."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc."""
    parents = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rfind(b")") + 2:].split()  # the command name may hold spaces and parentheses
        parents[int(name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, queue = [], list(children.get(pid, []))
    while queue:
        p = queue.pop(0)
        found.append(p)
        queue.extend(children.get(p, []))
    return found


def kill_descendants(pid: int, rounds: int = 5) -> int:
    """SIGKILL every descendant of ``pid`` (again while new ones appear); returns how many were killed."""
    killed = 0
    for _ in range(rounds):
        found = descendants(pid)
        if not found:
            break
        for p in found:
            try:
                os.kill(p, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def reap_children() -> None:
    """Collect exited children (a subreaper inherits orphans and must wait for them)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


__all__ = ["become_subreaper", "descendants", "kill_descendants", "reap_children"]
