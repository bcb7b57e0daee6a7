"""Telling a lost node from a worker that died alone (``hybridflow/controller/node_loss.py``); the whole scenario, a
host's processes killed mid-run, is ``tests/faults/test_two_hosts.py``."""

from __future__ import annotations

import pickle
import socket

from hybridflow.controller.errors import NodeLostError, WorkerDiedError
from hybridflow.controller.node_loss import _check, raylet_unreachable


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


def test_a_raylet_that_listens_is_reachable_and_one_that_does_not_refuses():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert raylet_unreachable("127.0.0.1", server.getsockname()[1]) is None
    port = _closed_port()
    why = raylet_unreachable("127.0.0.1", port)
    assert why is not None and f"127.0.0.1:{port} refuses connections" in why


def test_a_node_is_lost_when_the_gcs_says_dead_or_its_raylet_is_gone():
    dead = _check({"NodeID": "ab12", "NodeManagerAddress": "10.0.0.9", "NodeManagerPort": 1, "Alive": False}, 1.0)
    assert (dead.node_id, dead.ip, dead.how) == ("ab12", "10.0.0.9", "Ray's GCS marks it dead")
    port = _closed_port()
    gone = _check({"NodeID": "cd34", "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port, "Alive": True}, 1.0)
    assert gone.node_id == "cd34" and "refuses connections" in gone.how and "still lists it alive" in gone.how
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        alive = {"NodeID": "ef56", "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": server.getsockname()[1],
                 "Alive": True}
        assert _check(alive, 1.0) is None


def test_the_error_names_the_node_and_survives_pickling():
    err = NodeLostError("actor_rollout", "ActorRolloutRefWorker", "update_actor", 1, "RpcError: Socket closed",
                        "f00d" * 14, "10.213.0.2", "its raylet at 10.213.0.2:4000 refuses connections")
    assert isinstance(err, WorkerDiedError)
    text = str(err)
    assert text.startswith(f"Lost Ray node {'f00d' * 14} (10.213.0.2): its raylet at 10.213.0.2:4000 refuses")
    assert "Rank 1 of worker group 'actor_rollout'" in text and "'update_actor'" in text
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is NodeLostError and str(again) == text and again.node_ip == "10.213.0.2"
