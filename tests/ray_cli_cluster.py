"""A two-node Ray cluster on this machine started the way a real one is, with the ``ray`` CLI (test helper).

``ray start --head`` and ``ray start --address=HEAD`` each run as a ``--block`` foreground process in a session of
its own, on loopback, with their own temp dir, their own ports (GCS, node manager, object manager, agents,
metrics, a block of worker ports) and their own resources, so they do not meet other Ray instances on the
machine.  Token authentication is on as Ray 2.60 sets it up for a cluster: ``ray get-auth-token --generate``
writes the token (here into the cluster's own directory instead of ``~/.ray``), and every process of the cluster
and every driver runs with ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` pointing at it.

:meth:`RayCliCluster.stop` ends exactly what was started: SIGTERM to each ``ray start --block`` process (it
stops its node's GCS / raylet / agents / workers on the way out), then SIGKILL to whatever is left *of those
sessions*; never ``ray stop``, which would kill every Ray process of the user on the machine.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))

PROBE = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
nodes = [{"id": n["NodeID"], "alive": n["Alive"], "ip": n["NodeManagerAddress"],
          "resources": {k: v for k, v in n["Resources"].items() if not k.startswith("node:")}} for n in ray.nodes()]
print("PROBE " + json.dumps({"nodes": nodes, "driver_node": ray.get_runtime_context().get_node_id()}), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Ports:
    """Free ports, each handed out once and never inside a reserved block (Ray refuses a node whose ports
    collide, e.g. an agent port inside its own worker-port range)."""

    def __init__(self):
        self.used: set[int] = set()
        self.blocks: list[range] = []

    def block(self, size: int = 200) -> range:
        while True:
            first = random.randrange(20000, 60000, 500)
            block = range(first, first + size)
            if not any(set(block) & set(b) for b in self.blocks) and not self.used & set(block):
                self.blocks.append(block)
                return block

    def port(self) -> int:
        while True:
            port = _free_port()
            if port not in self.used and not any(port in b for b in self.blocks):
                self.used.add(port)
                return port


class RayCliCluster:
    """Head + one worker node, each ``--num-cpus`` CPUs and one custom resource named after the node."""

    def __init__(self, num_cpus: int = 1, start_timeout_s: float = 120.0):
        self.num_cpus = num_cpus
        self.start_timeout_s = start_timeout_s
        # Ray's socket paths live under the temp dir and must stay short (AF_UNIX: 107 bytes)
        self.root = Path(tempfile.mkdtemp(prefix="hfray_", dir="/tmp"))
        self.token_path = self.root / "auth_token"
        self.ports = _Ports()
        self.blocks = [self.ports.block(), self.ports.block()]  # worker ports of the head, of the worker node
        self.gcs_port = self.ports.port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.node_ports: dict[str, dict[str, int]] = {}  # per node: `ray start` option -> the port it was given
        self.worker_ports: dict[str, range] = {}  # per node: its workers' port block (--min/max-worker-port)

    # ------------------------------------------------------------------ where each node runs (hooks)
    def node_ip(self, name: str) -> str:
        """The address node ``name`` advertises (``--node-ip-address``)."""
        return "127.0.0.1"

    def node_cpus(self, name: str) -> int:
        return self.num_cpus

    def wrap(self, name: str, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` where node ``name`` lives (here: as it is)."""
        return argv

    # ------------------------------------------------------------------ environment
    def env(self, token: bool = True) -> dict[str, str]:
        """The environment of a cluster process or a driver: the token (or none), no inherited Ray address."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
        if token:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_path))
        else:
            env["RAY_AUTH_MODE"] = "disabled"
            # a refused driver retries once per second for as many seconds as this says (tests/conftest.py sets
            # it for slow local starts): Ray's own ~20 attempts are enough to see the refusal
            env.pop("RAY_gcs_server_port_wait_time_s", None)
        return env

    def _node_ports(self, name: str, block: range, extra: dict[str, int]) -> list[str]:
        options = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
                   "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")
        ports = {**{option: self.ports.port() for option in options}, **extra}
        self.node_ports[name], self.worker_ports[name] = ports, block
        return [*(f"--{option}={port}" for option, port in ports.items()),
                f"--min-worker-port={block.start}", f"--max-worker-port={block.stop - 1}"]

    # ------------------------------------------------------------------ start / stop
    def generate_token(self) -> None:
        """``ray get-auth-token --generate`` with HOME pointed at the cluster dir: Ray writes ``.ray/auth_token``."""
        home = self.root / "home"
        env = {**self.env(token=False), "HOME": str(home)}
        env.pop("RAY_AUTH_MODE")
        out = subprocess.run([RAY, "get-auth-token", "--generate"], env=env, capture_output=True, text=True,
                             timeout=60)
        generated = home / ".ray" / "auth_token"
        if out.returncode != 0 or not generated.is_file():
            raise RuntimeError(f"ray get-auth-token --generate failed ({out.returncode}): {out.stderr[-2000:]}")
        shutil.copy(generated, self.token_path)
        self.token_path.chmod(0o600)

    def _start(self, name: str, args: list[str], block: range, ports: dict[str, int] | None = None) -> None:
        log = self.root / f"{name}.log"
        self.logs[name] = log
        with open(log, "w") as f:
            self.procs[name] = subprocess.Popen(
                self.wrap(name, [RAY, "start", "--block", f"--node-ip-address={self.node_ip(name)}",
                                 f"--num-cpus={self.node_cpus(name)}", "--num-gpus=0",
                                 f"--resources={json.dumps({f'hf_{name}': 1})}", "--disable-usage-stats",
                                 *self._node_ports(name, block, ports or {}), *args]),
                env=self.env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self) -> None:
        self.generate_token()
        # --include-dashboard=false still starts a minimal dashboard process: on a port of its own, not 8265
        self._start("head", ["--head", "--include-dashboard=false", f"--temp-dir={self.root / 'ray'}"], self.blocks[0],
                    {"port": self.gcs_port, "dashboard-port": self.ports.port(),
                     "ray-client-server-port": self.ports.port()})
        self._wait(lambda nodes: len(nodes) >= 1, "the head node")
        self._start("worker", [f"--address={self.address}"], self.blocks[1])
        self._wait(lambda nodes: len(nodes) == 2, "the worker node")

    def _wait(self, ready, what: str, lost: tuple[str, ...] = ()) -> None:
        """Until ``ready(alive nodes)``; a node's ``ray start`` exiting meanwhile fails (except nodes in ``lost``)."""
        deadline = time.monotonic() + self.start_timeout_s
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None and name not in lost:
                    raise RuntimeError(f"ray start ({name}) exited with {proc.returncode}:\n{self.log_tail(name)}")
            try:
                info = self.probe()
                if ready([n for n in info["nodes"] if n["alive"]]):
                    return
            except RuntimeError as e:
                last = str(e)
            time.sleep(1.0)
        raise RuntimeError(f"{what} did not come up within {self.start_timeout_s:.0f}s: {last}\n"
                           + "\n".join(self.log_tail(n) for n in self.procs))

    def probe(self, token: bool = True, timeout_s: float = 60.0) -> dict:
        """Connect a short-lived driver and return the cluster's nodes and the driver's node (raises on failure)."""
        out = subprocess.run(self.wrap("head", [sys.executable, "-c", PROBE, self.address]), env=self.env(token),
                             capture_output=True, text=True, timeout=timeout_s)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")]
        if out.returncode != 0 or not lines:
            raise RuntimeError(f"probe failed ({out.returncode}): {(out.stderr or out.stdout)[-3000:]}")
        return json.loads(lines[-1][len("PROBE "):])

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs.get(name)
        text = path.read_text(errors="replace") if path and path.exists() else ""
        return f"--- {name} ---\n{text[-chars:]}"

    def own_processes(self) -> list[int]:
        """Processes still alive from this cluster's sessions (the session id of each ``ray start``)."""
        sessions = {p.pid for p in self.procs.values()}
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getsid(int(entry.name)) in sessions:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
        return pids

    def stop(self, timeout_s: float = 60.0) -> list[int]:
        """Stop every node (the head last); returns the pids that had to be killed after the graceful stop (ideally
        none)."""
        for name in reversed(list(self.procs)):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        deadline = time.monotonic() + 15.0
        left = self.own_processes()
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = self.own_processes()
        for pid in left:  # only processes of the sessions started above
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)
        return left
