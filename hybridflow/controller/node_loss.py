"""Whether a worker died with its node: a lost host, named by node id and IP within seconds.

When every process of a host dies (the machine went down, its network was cut, its processes were killed), Ray's
GCS declares the node dead only after its health checks have failed for a while (Ray's defaults: a check every 3 s,
dead after 5 failures in a row); the first thing the driver sees is a call to a worker of that node failing
because the connection closed ("The actor is temporarily unavailable: RpcError: Socket closed").  To name the
real cause at once, :func:`lost_node_of` finds the node the dead actor lived on (Ray's actor table) and knocks at
that node's raylet: a TCP connection to its node-manager port, bounded by a timeout.  Refused (nothing listens
there any more), unreachable or silent means the whole host is lost, not one process; a raylet that answers
means the worker died alone (a crash, an OOM kill).  A node the GCS already marks dead is lost without a knock.
"""

from __future__ import annotations

import errno
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

__all__ = ["LostNode", "lost_node_note", "lost_node_of", "raylet_unreachable"]


@dataclass(frozen=True)
class LostNode:
    node_id: str
    ip: str
    how: str  # why the node counts as lost, in words

    def describe(self) -> str:
        return f"Lost Ray node {self.node_id} ({self.ip}): {self.how}"


def raylet_unreachable(ip: str, port: int, timeout_s: float = 2.0) -> str | None:
    """Why the raylet at ``ip:port`` cannot be reached (None when a TCP connection to it opens)."""
    try:
        with socket.create_connection((ip, int(port)), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return f"its raylet at {ip}:{port} refuses connections (no Ray process of that host is listening any more)"
    except TimeoutError:
        return f"its raylet at {ip}:{port} does not answer within {timeout_s:g} s (the host or its network is down)"
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
            return f"its raylet at {ip}:{port} is unreachable ({e.strerror}: the host or its network is down)"
        return f"its raylet at {ip}:{port} cannot be reached ({type(e).__name__}: {e})"


def _actor_node_id(actor_id: str | None) -> str | None:
    """The node id of the node an actor was placed on, from the GCS actor table (None if unknown)."""
    if not actor_id:
        return None
    if isinstance(actor_id, bytes):
        actor_id = actor_id.hex()
    try:
        from ray._private import state

        info = state.actors(actor_id=actor_id)
        return (info.get("Address") or {}).get("NodeID") or None
    except Exception:  # noqa: BLE001 - a diagnosis must never replace the error it explains
        return None


def _check(node: dict, timeout_s: float) -> LostNode | None:
    node_id, ip = node.get("NodeID", "?"), node.get("NodeManagerAddress", "?")
    if not node.get("Alive", True):
        return LostNode(node_id, ip, "Ray's GCS marks it dead")
    why = raylet_unreachable(ip, node.get("NodeManagerPort", 0), timeout_s)
    if why is None:
        return None
    return LostNode(node_id, ip, f"{why}; Ray's GCS still lists it alive (its health checks have not run out yet)")


def lost_node_of(actor_id: str | None, timeout_s: float = 2.0) -> LostNode | None:
    """The lost node that held actor ``actor_id`` -- or, when the actor's node is unknown, any node the GCS lists
    alive that does not answer (nodes that died earlier are no news) -- else None (the worker died alone)."""
    import ray

    try:
        nodes = ray.nodes()
    except Exception:  # noqa: BLE001 - the GCS itself is gone: nothing to look up, the original error stands
        return None
    node_id = _actor_node_id(actor_id)
    if node_id:
        candidates = [n for n in nodes if n.get("NodeID") == node_id]
    else:
        candidates = [n for n in nodes if n.get("Alive")]
    if not candidates:
        return None
    with ThreadPoolExecutor(max_workers=min(16, len(candidates))) as pool:
        for lost in pool.map(lambda n: _check(n, timeout_s), candidates):
            if lost is not None:
                return lost
    return None


def lost_node_note(exc: BaseException) -> str | None:
    """"Lost Ray node ID (IP): why" when ``exc`` is a Ray actor failure and the actor's node is lost (for errors
    raised away from the worker groups, e.g. a rollout replica's stream), else None."""
    import ray.exceptions as rex

    if not isinstance(exc, rex.RayActorError):
        return None
    lost = lost_node_of(getattr(exc, "actor_id", None))
    return None if lost is None else lost.describe()
