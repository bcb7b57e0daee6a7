"""Errors the controller raises when something goes wrong inside (or around) a worker group.

The point of these types is that a failure on rank 3 of the critic reads, in the controller's
terminal, as exactly that -- instead of a bare ``RayTaskError`` or a silent hang.
"""

from __future__ import annotations

__all__ = ["ControllerError", "WorkerError", "WorkerDiedError", "NodeLostError", "ResourceUnavailableError",
           "RayInitError"]


class ControllerError(RuntimeError):
    """Base class of every error raised by ``hybridflow.controller``."""


class WorkerError(ControllerError):
    """A worker method raised: names the role, worker class, method and rank, with the remote traceback.

    ``remote_traceback`` is the worker-side traceback text; on the local backend ``__cause__`` is the
    original exception (use ``pdb.post_mortem(err.__cause__.__traceback__)`` to land in the worker frame).
    ``remote_cause`` is the exception object the worker raised, when Ray could bring it back (else None):
    callers that treat some error types specially look at it.
    """

    def __init__(self, role: str, worker_class: str, method: str, rank: int, remote_traceback: str,
                 remote_cause: BaseException | None = None):
        self.remote_cause = remote_cause
        self.role = role
        self.worker_class = worker_class
        self.method = method
        self.rank = rank
        self.remote_traceback = remote_traceback
        super().__init__(
            f"{worker_class}.{method} failed on rank {rank} of worker group '{role}'.\n"
            f"--- remote traceback (rank {rank}) ---\n{remote_traceback.rstrip()}"
        )

    def __reduce__(self):
        return (type(self), (self.role, self.worker_class, self.method, self.rank, self.remote_traceback))


class WorkerDiedError(ControllerError):
    """A worker process exited (crash, OOM kill, ``os._exit``, ``ray.kill``) while the controller waited on it."""

    def __init__(self, role: str, worker_class: str, method: str, rank: int, detail: str):
        self.role = role
        self.worker_class = worker_class
        self.method = method
        self.rank = rank
        self.detail = detail
        super().__init__(
            f"Worker process of rank {rank} in worker group '{role}' ({worker_class}) died while running "
            f"'{method}'. The group is unusable now: shut it down and restart from the last checkpoint.\n"
            f"Cause reported by Ray: {detail.strip()}"
        )

    def __reduce__(self):
        return (type(self), (self.role, self.worker_class, self.method, self.rank, self.detail))


class NodeLostError(WorkerDiedError):
    """A worker died because its whole node is gone (every Ray process of that host), not by itself: names the node
    (id and IP) and why it counts as lost (``hybridflow/controller/node_loss.py``)."""

    def __init__(self, role: str, worker_class: str, method: str, rank: int, detail: str, node_id: str,
                 node_ip: str, how: str):
        self.role = role
        self.worker_class = worker_class
        self.method = method
        self.rank = rank
        self.detail = detail
        self.node_id = node_id
        self.node_ip = node_ip
        self.how = how
        ControllerError.__init__(
            self,
            f"Lost Ray node {node_id} ({node_ip}): {how}. Rank {rank} of worker group '{role}' ({worker_class}) ran "
            f"there and died while running '{method}', with every other process of that node. The run cannot go "
            f"on without the node: resume from the last checkpoint on the nodes that remain.\n"
            f"Cause reported by Ray: {detail.strip()}"
        )

    def __reduce__(self):
        return (type(self), (self.role, self.worker_class, self.method, self.rank, self.detail, self.node_id,
                             self.node_ip, self.how))


class ResourceUnavailableError(ControllerError):
    """A resource pool asks for more CPUs/GPUs than the Ray cluster has, or its placement never became ready."""


class RayInitError(ControllerError):
    """``ray.init`` failed; the message repeats what was asked so the user can fix ``ray_kwargs``."""
