"""Servers hybridflow starts listen on the loopback unless the run spans machines (issue 24: the torch.distributed
TCPStore listened on every interface, with no authentication)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap

import psutil

from hybridflow.utils.rendezvous_bind import LOOPBACK, free_port, rendezvous_host, tcp_store


def listening(pid: int) -> list[tuple[str, int]]:
    return sorted((c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
                  if c.status == psutil.CONN_LISTEN)


def test_single_machine_rendezvous_is_the_loopback(monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_RENDEZVOUS_HOST", raising=False)
    assert rendezvous_host() == LOOPBACK
    monkeypatch.setenv("HYBRIDFLOW_RENDEZVOUS_HOST", "10.1.2.3")
    assert rendezvous_host() == "10.1.2.3"


def test_tcp_store_listens_on_the_given_address_only():
    port = free_port()
    store = tcp_store(LOOPBACK, port, 1, True, datetime.timedelta(seconds=10))
    store.set("k", "v")
    client = tcp_store(LOOPBACK, port, 1, False, datetime.timedelta(seconds=10))
    assert client.get("k") == b"v"
    mine = [addr for addr in listening(os.getpid()) if addr[1] == port]
    assert mine == [(LOOPBACK, port)], listening(os.getpid())


SCRIPT = textwrap.dedent("""
    import os, sys, json, psutil
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", HYBRIDFLOW_DEVICE="cpu")
    os.environ.pop("MASTER_PORT", None)
    from hybridflow.controller.worker import Worker
    from hybridflow.rollout.weights.checkpoint_engine import BroadcastCheckpointEngine, WeightSyncSpec, free_port, node_address
    w = Worker()
    w.init_distributed(timeout_s=30)
    engine = BroadcastCheckpointEngine(WeightSyncSpec("gloo", node_address(), free_port(), 1, 0), 0).connect()
    socks = [(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet")
             if c.status == psutil.CONN_LISTEN]
    print(json.dumps({"master": os.environ["MASTER_ADDR"], "listening": socks}))
""")


def test_a_workers_process_group_and_weight_sync_listen_on_the_loopback_only():
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME",
                                                            "HYBRIDFLOW_RENDEZVOUS_HOST")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["master"] == LOOPBACK
    assert report["listening"], report
    exposed = [s for s in report["listening"] if not s[0].startswith("127.") and s[0] != "::1"]
    assert exposed == [], f"listening beyond the loopback: {exposed} (all: {report['listening']})"


def test_gloo_is_pinned_to_the_interface_that_carries_the_rendezvous_address(monkeypatch):
    from hybridflow.utils.rendezvous_bind import interface_of, pin_gloo_interface

    assert interface_of("127.0.0.1") == "lo" and interface_of("203.0.113.77") is None
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("HYBRIDFLOW_RENDEZVOUS_HOST", raising=False)
    pin_gloo_interface(LOOPBACK)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the user's choice wins
    pin_gloo_interface(LOOPBACK)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"
