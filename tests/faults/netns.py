"""Two hosts on one machine: two network namespaces joined by a veth pair (test helper; needs root and ``ip``).

:class:`NetnsPair` makes namespace ``A`` (address :data:`IP_A`) and namespace ``B`` (:data:`IP_B`), the two ends of
one veth pair, addresses from the private /30 :data:`SUBNET`, loopback up in each.  Nothing else is in them: no
default route, no link to the machine's own network, so a process inside reaches the other namespace and its own
loopback and nothing more, and nothing outside the pair reaches a socket inside (the machine's own namespace has
no route to the /30).  ``ip netns exec`` runs a command "on" a host; every process started there (and its
children, e.g. the workers a raylet forks) stays in that namespace, which is how :meth:`NetnsPair.pids` finds
*every* process of a host -- ``ip netns pids`` lists exactly the processes of that namespace, whoever started
them.

:meth:`NetnsPair.remove` kills what is left in the two namespaces and deletes them (the veth pair goes with
them); it is meant for a ``finally`` and never raises.  It never runs ``ray stop``: that command is not scoped to
a namespace (it kills every Ray process of the user on the machine, found by name), so it would stop other Ray
instances of this machine as well; killing the namespace's own processes is the namespace-scoped equivalent.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

import psutil

SUBNET = "10.213.0.0/30"
IP_A, IP_B = "10.213.0.1", "10.213.0.2"
LOOPBACK = ("127.0.0.1", "::1")


def netns_unavailable() -> str | None:
    """Why two namespaces cannot be made here (None when they can): tried for real with a namespace of its own."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces (`ip netns add`) needs root; this test runs as uid %d" % os.geteuid()
    name = f"hfprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return None


@dataclass(frozen=True)
class Host:
    ns: str  # namespace name
    ifname: str  # its end of the veth pair
    ip: str


@dataclass(frozen=True)
class Listener:
    """One listening socket of a process (TCP in LISTEN, or a UDP socket bound without a peer)."""

    host: str
    pid: int
    process: str
    proto: str
    ip: str
    port: int

    @property
    def wildcard(self) -> bool:
        return self.ip in ("0.0.0.0", "::", "")

    def __str__(self) -> str:
        return f"{self.host} {self.proto} {self.ip}:{self.port} pid {self.pid} {self.process}"


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


class NetnsPair:
    """Namespaces ``A`` and ``B`` joined by a veth pair; ``with NetnsPair() as pair:`` creates and removes them."""

    def __init__(self, tag: str | None = None):
        tag = tag or secrets.token_hex(3)  # interface names: at most 15 characters
        self.hosts = {"A": Host(f"hf{tag}a", f"hf{tag}va", IP_A), "B": Host(f"hf{tag}b", f"hf{tag}vb", IP_B)}
        self.prefix = ipaddress.ip_network(SUBNET).prefixlen
        self.created: list[str] = []

    def __enter__(self) -> NetnsPair:
        self.create()
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def create(self) -> None:
        a, b = self.hosts["A"], self.hosts["B"]
        try:
            for host in (a, b):
                _run(["ip", "netns", "add", host.ns])
                self.created.append(host.ns)
            _run(["ip", "link", "add", a.ifname, "netns", a.ns, "type", "veth", "peer", "name", b.ifname,
                  "netns", b.ns])
            for host in (a, b):
                _run(["ip", "-n", host.ns, "addr", "add", f"{host.ip}/{self.prefix}", "dev", host.ifname])
                _run(["ip", "-n", host.ns, "link", "set", "lo", "up"])
                _run(["ip", "-n", host.ns, "link", "set", host.ifname, "up"])
        except BaseException:
            self.remove()
            raise

    # ------------------------------------------------------------------ running things on a host
    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run inside namespace ``host`` ("A" or "B")."""
        return ["ip", "netns", "exec", self.hosts[host].ns, *argv]

    def pids(self, host: str) -> list[int]:
        """Every process in the namespace of ``host`` (``ip netns pids``)."""
        out = _run(["ip", "netns", "pids", self.hosts[host].ns], check=False)
        return [int(p) for p in out.stdout.split()]

    def kill_host(self, host: str, sig: int = signal.SIGKILL, settle_s: float = 10.0) -> list[int]:
        """Send ``sig`` to every process of ``host`` until none is left (or ``settle_s`` passed); the pids hit."""
        hit: list[int] = []
        deadline = time.monotonic() + settle_s
        while True:
            pids = [p for p in self.pids(host) if p not in hit or sig == signal.SIGKILL]
            if not pids or time.monotonic() > deadline:
                return hit
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    continue
                if pid not in hit:
                    hit.append(pid)
            if sig != signal.SIGKILL:
                return hit
            time.sleep(0.1)

    def unplug(self) -> None:
        """Delete the veth pair: both hosts keep running but can no longer reach each other."""
        _run(["ip", "-n", self.hosts["A"].ns, "link", "del", self.hosts["A"].ifname], check=False)

    # ------------------------------------------------------------------ what listens
    def listeners(self, host: str) -> list[Listener]:
        """Every listening socket of every process of ``host``: the namespace's own socket tables
        (``/proc/PID/net/{tcp,tcp6,udp,udp6}`` of a process inside it; psutil would read this process's namespace)
        matched to each process's open sockets."""
        owners: dict[int, tuple[int, str]] = {}  # socket inode -> (pid, process)
        pids = self.pids(host)
        for pid in pids:
            try:
                name = _process_name(psutil.Process(pid))
                fds = os.listdir(f"/proc/{pid}/fd")
            except (psutil.Error, OSError):
                continue
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    owners.setdefault(int(target[8:-1]), (pid, name))
        found = []
        for row in _socket_table(pids):
            if row.inode in owners:
                pid, name = owners[row.inode]
                found.append(Listener(host, pid, name, row.proto, row.ip, row.port))
        return sorted(set(found), key=lambda x: (x.process, x.port, x.ip))

    # ------------------------------------------------------------------ clean-up
    def remove(self) -> list[str]:
        """Kill every process left in the namespaces, delete them (and so the veth pair); what went wrong, if any."""
        problems = []
        for name, host in self.hosts.items():
            if host.ns not in self.created:
                continue
            left = self.kill_host(name, signal.SIGKILL)
            if self.pids(name):
                problems.append(f"processes of {host.ns} survived SIGKILL: {self.pids(name)}")
            out = _run(["ip", "netns", "del", host.ns], check=False)
            if out.returncode != 0:
                problems.append(f"ip netns del {host.ns}: {out.stderr.strip()}")
            else:
                self.created.remove(host.ns)
            if left:
                problems.append(f"killed {len(left)} processes left in {host.ns}")
        return problems

    def exists(self) -> dict[str, bool]:
        """Whether each namespace and veth end still exists (for the clean-up check)."""
        names = set(_run(["ip", "netns", "list"], check=False).stdout.split())
        links = _run(["ip", "-o", "link"], check=False).stdout
        found = {h.ns: h.ns in names for h in self.hosts.values()}
        found.update({h.ifname: f" {h.ifname}@" in links or f" {h.ifname}:" in links for h in self.hosts.values()})
        return found


def _process_name(proc: psutil.Process) -> str:
    """A Ray worker's title (``ray::RayWorker...``), else the executable's name and its script."""
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return proc.name()
    if cmd and cmd[0].startswith("ray::"):
        return cmd[0].split()[0]
    scripts = [os.path.basename(a) for a in cmd[1:3] if a.endswith(".py") or a.startswith("-m")]
    return " ".join([os.path.basename(cmd[0]) if cmd else proc.name(), *scripts])


@dataclass(frozen=True)
class _Row:
    proto: str
    ip: str
    port: int
    inode: int


def _decode(hex_addr: str) -> tuple[str, int]:
    """``0100007F:1F90`` / the 32-digit IPv6 form of /proc/net/tcp* as (ip, port)."""
    addr, port = hex_addr.split(":")
    raw = bytes.fromhex(addr)
    # the kernel prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def _socket_table(pids: list[int]) -> list[_Row]:
    """Listening TCP sockets (state 0A) and unconnected UDP sockets of the namespace that ``pids`` live in."""
    for pid in pids:
        rows = []
        try:
            for proto in ("tcp", "tcp6", "udp", "udp6"):
                with open(f"/proc/{pid}/net/{proto}") as f:
                    for line in f.read().splitlines()[1:]:
                        cols = line.split()
                        local, remote, state, inode = cols[1], cols[2], cols[3], int(cols[9])
                        tcp_listen = proto.startswith("tcp") and state == "0A"
                        udp_bound = proto.startswith("udp") and set(remote.split(":")[1]) == {"0"}
                        if tcp_listen or udp_bound:
                            ip, port = _decode(local)
                            rows.append(_Row(proto.rstrip("6"), ip, port, inode))
        except OSError:
            continue  # that process has gone; any other one of the namespace shows the same tables
        return rows
    return []
