"""Where hybridflow's own rendezvous servers listen: the loopback interface unless the run spans machines.

torch's ``TCPStore`` (the key-value server behind ``init_process_group`` and the weight-sync groups) listens on
every interface of the machine and has no authentication. On one machine nothing outside it needs to reach
it, so :func:`tcp_store` binds the server's socket to the rendezvous address itself -- ``127.0.0.1`` on a
single machine -- and hands it to ``TCPStore`` already listening. A Ray cluster with more than one live node
is "configured for a cluster": the rendezvous address is then this node's IP, and the store listens on that
interface only. ``HYBRIDFLOW_RENDEZVOUS_HOST`` overrides the choice.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import sys

ENV_HOST = "HYBRIDFLOW_RENDEZVOUS_HOST"
LOOPBACK = "127.0.0.1"


def _ray_cluster_ip() -> str | None:
    """This node's IP when Ray runs here with more than one live node, else None."""
    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]
    except Exception:  # noqa: BLE001 - a client without GCS access: assume a cluster, stay reachable
        return ray.util.get_node_ip_address()
    return ray.util.get_node_ip_address() if len(alive) > 1 else None


def rendezvous_host() -> str:
    """The address other ranks use to reach servers this process starts (see the module docstring)."""
    return os.environ.get(ENV_HOST) or _ray_cluster_ip() or LOOPBACK


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def free_port(host: str = LOOPBACK) -> int:
    """A port that is free on ``host`` right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tcp_store(host: str, port: int, world_size: int, is_master: bool, timeout: datetime.timedelta):
    """A ``torch.distributed.TCPStore`` whose server (on the master) listens on ``host`` only."""
    import torch.distributed as dist

    if not is_master:
        return dist.TCPStore(host, int(port), world_size, False, timeout=timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(1024)
    store = dist.TCPStore(host, int(port), world_size, True, timeout=timeout, master_listen_fd=sock.detach())
    return store


def pin_gloo_to_loopback(host: str) -> None:
    """Gloo's pair sockets listen where the hostname resolves; on one machine, make that the loopback."""
    if is_loopback(host) and not os.environ.get("GLOO_SOCKET_IFNAME"):
        names = {name for _, name in socket.if_nameindex()}
        if "lo" in names:
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"


__all__ = ["ENV_HOST", "LOOPBACK", "free_port", "is_loopback", "pin_gloo_to_loopback", "rendezvous_host",
           "tcp_store"]
