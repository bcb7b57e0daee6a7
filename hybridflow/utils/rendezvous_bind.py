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


def interface_of(ip: str) -> str | None:
    """The name of this machine's network interface that carries address ``ip`` (None when none does)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == ip for a in addrs):
            return name
    return None


def pin_gloo_interface(master_host: str) -> None:
    """Make gloo's pair sockets listen where the other ranks can reach them, and only there.

    Without ``GLOO_SOCKET_IFNAME`` gloo listens on the address the machine's hostname resolves to: on many machines
    that is a loopback address (``/etc/hosts``), which ranks on other nodes cannot reach (the rendezvous then
    fails with "Connection refused, remote=[127.0.0.1]"), and on others an address of every network the machine
    is on.  On one machine (a loopback rendezvous) gloo is pinned to the loopback interface; in a multi-node
    cluster to the interface that carries this node's own rendezvous address (:func:`rendezvous_host`).  A
    ``GLOO_SOCKET_IFNAME`` set by the user wins."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    own = LOOPBACK if is_loopback(master_host) else rendezvous_host()
    name = interface_of(own) or ("lo" if is_loopback(own) and "lo" in {n for _, n in socket.if_nameindex()} else None)
    if name:
        os.environ["GLOO_SOCKET_IFNAME"] = name


__all__ = ["ENV_HOST", "LOOPBACK", "free_port", "interface_of", "is_loopback", "pin_gloo_interface",
           "rendezvous_host", "tcp_store"]
