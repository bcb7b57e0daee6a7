"""Faults across hosts (issue 34 item 8): a Ray cluster over two network namespaces of this machine, one host lost
mid-step.

Host A (namespace A, 10.213.0.1) runs the Ray head and the driver, host B (namespace B, 10.213.0.2) a Ray worker
node; a veth pair is the only link (``tests/faults/netns.py``, ``tests/faults/two_hosts.py``).  A GRPO run with
``trainer.nnodes=2 trainer.n_gpus_per_node=1`` puts one rank on A and one on B (each node declares 1 CPU, a rank
takes 1; the run's own placement line is checked).

1. An uninterrupted 3-step run (checkpoint every step) is the reference; while it runs, every listening socket of
   every process of both hosts is recorded and checked against where it may listen.
2. The same run again; during step 2 (checkpoint 1 written) every process of host B is killed with SIGKILL.  The
   run must stop within seconds, exit with the worker-lost code (4) and name the lost node by IP and node id in
   one message, without a traceback.
3. The same command resumed (``trainer.resume_mode=auto``) on what is left, host A: a second Ray node is started
   there with host A's second CPU (Ray's CPU counts are declared at ``ray start``), so both ranks run on host A
   with the same data-parallel size (the per-rank sampling seeds are the same); the run must continue from step 2
   and reproduce the reference's steps 2 and 3 exactly.

Needs root and ``ip netns``; skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from hybridflow.trainer import run_checkpoint as ckpt

from .conftest import REPO, base_args, cli_env
from .netns import IP_A, IP_B, Listener, NetnsPair, netns_unavailable

pytest.importorskip("ray")
_WHY_NOT = netns_unavailable()
pytestmark = [pytest.mark.ray, pytest.mark.slow,
              pytest.mark.skipif(_WHY_NOT is not None, reason=f"two hosts in network namespaces: {_WHY_NOT}")]

A = "actor_rollout_ref"
STEPS = 3
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/", "system/")
EXIT_ROLLOUT_FAILED, EXIT_WORKER_LOST = 3, 4


@pytest.fixture(scope="module")
def hosts():
    """The two namespaces and the Ray cluster over them; everything is removed afterwards, also on failure."""
    from .two_hosts import TwoHostRayCluster

    pair = NetnsPair()
    cluster = None
    try:
        pair.create()
        cluster = TwoHostRayCluster(pair, cpus={"head": 1, "worker": 1})
        cluster.start()
        yield pair, cluster
    finally:
        if cluster is not None:
            cluster.stop()
        problems = [p for p in pair.remove() if not p.startswith("killed")]
        assert not problems, problems
        assert not any(pair.exists().values()), f"left behind: {pair.exists()}"


REWARD = '''"""A dense reward (any character changes the score) that can hold the run at its {at}th call (gate: {gate!r}).

Every process that scores (the driver, an agent-loop worker on either host) appends one byte to a shared counter
file: the call that writes byte number {at} is the {at}th of the run, wherever it runs; it marks the gate "held"
and waits (bounded) for the test to write "go".
"""
import os
import time

GATE, AT = {gate!r}, {at}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if GATE:
        fd = os.open(os.path.join(GATE, "calls"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, b".")
            nth = os.lseek(fd, 0, os.SEEK_CUR)
        finally:
            os.close(fd)
        if nth == AT:
            open(os.path.join(GATE, "held"), "w").close()
            deadline = time.monotonic() + 300
            while not os.path.exists(os.path.join(GATE, "go")) and time.monotonic() < deadline:
                time.sleep(0.02)
    return (sum(ord(ch) * (i + 1) for i, ch in enumerate(solution_str)) % 11) / 10.0
'''


def _reward(run_dir: Path, gate_at: int | None = None) -> str:
    """The reward module of a run: ``gate_at`` holds the run at that call of the reward (see REWARD)."""
    gate = run_dir / "gate" if gate_at else None
    if gate:
        gate.mkdir(parents=True, exist_ok=True)
    path = run_dir / "reward_fn.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(REWARD.format(gate=str(gate) if gate else "", at=gate_at or 0))
    return str(path)


def _args(model_dir, data_dir, run_dir, cluster, nodes, per_node, gate_at=None):
    keep = [a for a in base_args(model_dir, data_dir / "train.parquet", run_dir, steps=STEPS, backend="ray")
            if not a.startswith(("trainer.nnodes=", "trainer.n_gpus_per_node="))]
    return [*keep, f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={per_node}", "trainer.save_freq=1",
            f"custom_reward_function.path={_reward(run_dir, gate_at)}", "custom_reward_function.name=compute_score",
            "trainer.total_epochs=10", f"{A}.actor.ppo_micro_batch_size_per_gpu=2",
            f"{A}.rollout.log_prob_micro_batch_size_per_gpu=4", f"{A}.ref.log_prob_micro_batch_size_per_gpu=4",
            f"+ray_kwargs.ray_init.address={cluster.address}"]


def _start(cluster, args, run_dir) -> subprocess.Popen:
    """``hybridflow train ARGS`` on host A, attached to the cluster."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**cli_env(), **cluster.env(), "PYTHONPATH": cli_env()["PYTHONPATH"]}
    log = open(run_dir / "train.log", "w")
    return subprocess.Popen(cluster.driver_argv("A", [sys.executable, "-m", "hybridflow", "train", *args]),
                            cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _finish(proc: subprocess.Popen, run_dir: Path, timeout_s: float = 900) -> tuple[int, str]:
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait(timeout=30)
    return rc, (run_dir / "train.log").read_text(errors="replace")


def _stable(run_dir: Path) -> list[dict]:
    path = run_dir / "outputs" / "faults" / "run" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    by_step = {m["training/global_step"]: m for m in rows if "timing_s/step" in m}  # a resumed run's rows win
    return [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for _, m in sorted(by_step.items())]


def _placement(log: str) -> list[str]:
    placed = re.search(r"hybridflow: \S+ ranks: (.*)", log)
    assert placed, f"the run did not say where its ranks went:\n{log[-4000:]}"
    return re.findall(r"rank \d+ on node (\w+)", placed.group(1))


class _SocketWatch(threading.Thread):
    """Every listening socket of both hosts, sampled every 0.5 s while a run lasts (their union)."""

    def __init__(self, pair: NetnsPair):
        super().__init__(daemon=True)
        self.pair, self.seen, self.stop = pair, set(), threading.Event()

    def run(self):
        while not self.stop.is_set():
            for host in ("A", "B"):
                self.seen.update(self.pair.listeners(host))
            time.sleep(0.5)


RAY_METRICS = {44217: ("monitor.py", "Ray's autoscaler metrics (AUTOSCALER_METRIC_PORT)"),
               44227: ("dashboard.py", "Ray's dashboard metrics (DASHBOARD_METRIC_PORT)")}


def _why_wildcard(sock: Listener, cluster) -> str | None:
    """Why a socket listening on every interface of its host is Ray's own (None: it is not explained).

    Ray 2.60 binds its gRPC servers (GCS, raylet, object manager, every core worker including the driver's), its
    dashboard agent and its metrics exporters to every interface, with no option to name an address; inside a
    namespace "every interface" is the veth address and the loopback (the machine's own network does not reach
    it: ``test_the_hosts_reach_each_other_and_nothing_else``)."""
    node = "head" if sock.host == "A" else "worker"
    option = next((o for o, port in cluster.node_ports[node].items() if port == sock.port), None)
    if option is not None:
        return f"Ray's --{option}"
    if sock.port in cluster.worker_ports[node] and (sock.process.startswith("ray::") or sock.process.startswith("python")):
        return "a Ray core worker's gRPC server (--min/max-worker-port)"
    if sock.port in RAY_METRICS and RAY_METRICS[sock.port][0] in sock.process:
        return RAY_METRICS[sock.port][1]
    return None


def _socket_table(seen: set[Listener], cluster) -> tuple[list[str], list[str]]:
    """One line per (host, pid, address, port), with where it may listen; and the lines that may not."""
    names: dict[tuple[str, int], str] = {}
    for s in seen:  # a Ray worker's title changes with the method it runs: keep its class
        name = re.sub(r"^(ray::\w+(\[\w+\])?)\..*$", r"\1", s.process)
        if name != "ray::IDLE" or (s.host, s.pid) not in names:
            names[(s.host, s.pid)] = name
    table, wrong = [], []
    for key in sorted({(s.host, s.pid, s.proto, s.ip, s.port) for s in seen}):
        host, pid, proto, ip, port = key
        sock = Listener(host, pid, names[(host, pid)], proto, ip, port)
        own = IP_A if host == "A" else IP_B
        if ip == own:
            why = "the host's veth address"
        elif ip.startswith("127.") or ip == "::1":
            why = "loopback"
        elif sock.wildcard:
            why = _why_wildcard(sock, cluster)
        else:
            why = None
        line = f"{sock}  -- {why or 'NOT ALLOWED'}"
        table.append(line)
        if why is None:
            wrong.append(line)
    return table, wrong


def test_the_hosts_reach_each_other_and_nothing_else(hosts):
    pair, cluster = hosts
    nodes = [n for n in cluster.probe()["nodes"] if n["alive"]]
    assert sorted(n["ip"] for n in nodes) == [IP_A, IP_B]
    port = cluster.gcs_port
    knock = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()"
    across = subprocess.run(pair.exec_argv("B", [sys.executable, "-c", knock, IP_A, str(port)]), capture_output=True,
                            text=True, timeout=60)
    assert across.returncode == 0, across.stderr  # B reaches the head over the veth pair
    routes = subprocess.run(pair.exec_argv("A", ["ip", "route"]), capture_output=True, text=True).stdout
    assert routes.split()[:1] == ["10.213.0.0/30"] and "default" not in routes, routes
    outside = subprocess.run([sys.executable, "-c", knock, IP_A, str(port)], capture_output=True, text=True,
                             timeout=60)  # from the machine's own namespace the head's port is not there
    assert outside.returncode != 0, "the machine's own namespace reached the head's GCS port in namespace A"


def _reference(pair, cluster, model_dir, data_dir, run_dir) -> list[dict]:
    """The uninterrupted run; every listening socket of both hosts is recorded while it lasts and checked."""
    worker_node = _node_on(cluster, IP_B)
    watch = _SocketWatch(pair)
    watch.start()
    rc, log = _finish(_start(cluster, _args(model_dir, data_dir, run_dir, cluster, 2, 1), run_dir), run_dir)
    watch.stop.set()
    watch.join()
    assert rc == 0, f"the uninterrupted run failed ({rc}):\n{log[-6000:]}"
    assert worker_node["id"][:8] in _placement(log), f"no rank on host B: {_placement(log)}"
    reference = _stable(run_dir)
    assert [m["training/global_step"] for m in reference] == [1.0, 2.0, 3.0]
    table, wrong = _socket_table(watch.seen, cluster)
    print("\nlistening sockets of the run (host proto address:port pid process -- why there):\n" + "\n".join(table))
    assert {line.split()[0] for line in table} == {"A", "B"}, table
    assert not wrong, "listening where it should not:\n" + "\n".join(wrong)
    return reference


def _lose_host_b_in_step_2(pair, cluster, model_dir, data_dir, run_dir) -> None:
    """The same run; its reward holds at the first sample of step 2 (4 prompts x 2 samples a step), every process
    of host B is killed, then the step goes on: the run must stop within seconds naming host B's node."""
    worker_node = _node_on(cluster, IP_B)
    proc = _start(cluster, _args(model_dir, data_dir, run_dir, cluster, 2, 1, gate_at=9), run_dir)
    deadline = time.monotonic() + 900
    while not (run_dir / "gate" / "held").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, f"the run ended before step 2:\n{(run_dir / 'train.log').read_text()[-4000:]}"
    assert ckpt.completed_steps(run_dir / "ckpt") == [1]
    killed_at = time.monotonic()
    hit = pair.kill_host("B")
    (run_dir / "gate" / "go").touch()
    rc, log = _finish(proc, run_dir, timeout_s=300)
    stop_s = time.monotonic() - killed_at
    print(f"\nkilled {len(hit)} processes of host B; the run exited {rc} {stop_s:.1f} s later; its last lines:\n"
          + "\n".join(log.strip().splitlines()[-4:]))
    assert hit and not pair.pids("B")
    # where the run notices decides the kind: a rollout in flight (exit 3) or a worker-group call (exit 4)
    assert rc in (EXIT_ROLLOUT_FAILED, EXIT_WORKER_LOST), f"exit {rc}:\n{log[-6000:]}"
    assert stop_s < 60, f"took {stop_s:.0f} s to stop"
    said = [line for line in log.splitlines() if line.startswith("hybridflow: ")
            and not line.startswith(("hybridflow: warning", "hybridflow: the run stopped", "hybridflow: connected",
                                     "hybridflow: colocated"))]
    assert said and f"Lost Ray node {worker_node['id']} ({IP_B})" in said[-1], log[-6000:]
    assert "Traceback" not in log, log[-6000:]
    assert [m["training/global_step"] for m in _stable(run_dir)] == [1.0]
    assert ckpt.completed_steps(run_dir / "ckpt") == [1]


def _node_on(cluster, ip: str) -> dict:
    return next(n for n in cluster.probe()["nodes"] if n["alive"] and n["ip"] == ip)


def _actor_params(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """Every tensor of the actor's checkpoint shards at ``step``, by file and key."""
    from hybridflow.utils.safe_load import load_torch_file

    out = {}
    for shard in sorted((ckpt.step_dir(run_dir / "ckpt", step) / "actor").glob("model_world_size_*.pt")):
        for key, value in load_torch_file(shard, map_location="cpu").items():
            if isinstance(value, torch.Tensor):  # a DTensor shard compares by its local part
                out[f"{shard.name}:{key}"] = value.to_local() if hasattr(value, "to_local") else value
    return out


def test_host_b_lost_mid_step_stops_the_run_naming_it_and_the_head_resumes_exactly(
        hosts, nano_model_dir, fault_data, tmp_path):
    pair, cluster = hosts
    reference = _reference(pair, cluster, nano_model_dir, fault_data, tmp_path / "reference")
    run_dir = tmp_path / "run"
    _lose_host_b_in_step_2(pair, cluster, nano_model_dir, fault_data, run_dir)

    # resumed on host A alone: a second Ray node there with A's spare CPU, the same two ranks, both on A
    cluster.add_node_on_a(cpus=1)
    args = _args(nano_model_dir, fault_data, run_dir, cluster, 2, 1)  # the same run, its reward without the gate
    rc, log = _finish(_start(cluster, args, run_dir), run_dir)
    assert rc == 0, f"the resumed run failed ({rc}):\n{log[-6000:]}"
    on_a = {n["id"][:8] for n in cluster.probe()["nodes"] if n["alive"] and n["ip"] == IP_A}
    assert len(on_a) == 2 and set(_placement(log)) == on_a, (_placement(log), on_a)
    resumed = _stable(run_dir)
    assert [m["training/global_step"] for m in resumed] == [1.0, 2.0, 3.0]
    differ = {k: (reference[i][k], resumed[i].get(k)) for i in (1, 2) for k in reference[i]
              if reference[i][k] != resumed[i].get(k)}
    want, got = _actor_params(tmp_path / "reference", STEPS), _actor_params(run_dir, STEPS)
    unequal = [k for k in want if k not in got or not torch.equal(want[k], got[k])]
    print(f"\nresumed steps 2-3: {len(reference[1]) + len(reference[2])} metrics compared with the reference, "
          f"{len(differ)} differ; final actor parameters: {len(want)} tensors, {len(unequal)} differ")
    assert not differ, differ
    assert want and set(got) == set(want) and not unequal, unequal[:5]
