"""``init_ray``: fails fast and says what was asked; a private instance unless a cluster is named, even with a
``ray start`` cluster left running on the machine (only the last test starts Ray, in subprocesses)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hybridflow.controller import RayInitError, init_ray

ray = pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[2]


def test_unreachable_address_fails_in_seconds_not_minutes():
    assert not ray.is_initialized()
    with pytest.raises(RayInitError, match=r"cannot reach the Ray head at ray_kwargs.ray_init.address='127.0.0.1:9'"):
        init_ray({"address": "127.0.0.1:9"})  # nothing listens on the discard port: a probe fails, no retry loop
    assert not ray.is_initialized()


def test_bad_ray_init_argument_is_named():
    with pytest.raises(RayInitError, match=r"(?s)a new local Ray instance with arguments .*num_cpuz"):
        init_ray({"num_cpuz": 2})
    assert not ray.is_initialized()


@pytest.mark.parametrize("user_value", [None, "45"])
def test_a_local_start_may_take_longer_than_rays_30_s_unless_the_user_says_otherwise(monkeypatch, user_value):
    """A busy 2-core machine (CI running tests beside it) can keep Ray's GCS server from publishing its port within
    Ray's default 30 s; init_ray allows LOCAL_START_WAIT_S, and a value the user exported wins."""
    from hybridflow.controller.ray_init import LOCAL_START_WAIT_S

    var = "RAY_gcs_server_port_wait_time_s"
    monkeypatch.setenv(var, "x")  # remembered, so the teardown restores what was there
    monkeypatch.delenv(var)
    if user_value is not None:
        monkeypatch.setenv(var, user_value)
    seen = {}

    def fake_init(**kwargs):
        seen["wait"] = os.environ.get(var)
        raise RuntimeError("stopped before starting anything")

    monkeypatch.setattr(ray, "init", fake_init)
    with pytest.raises(RayInitError, match="stopped before starting anything"):
        init_ray({})
    assert seen["wait"] == (user_value or str(LOCAL_START_WAIT_S))
    assert os.environ.get(var) == user_value  # only for the start: a later connection keeps Ray's retry count
    assert LOCAL_START_WAIT_S > 30


GCS_NEVER_UP = """
import psutil
from hybridflow.controller import RayInitError, init_ray
try:
    init_ray({"num_cpus": 1})
    print("STARTED")
except RayInitError as e:
    print("ERROR", e)
left = [p.pid for p in psutil.Process().children(recursive=True) if "gcs_server" in " ".join(p.cmdline())]
print("GCS LEFT", left)
"""


def test_a_gcs_that_never_publishes_its_port_is_named_cleaned_away_and_tried_once_more():
    """RAY_gcs_server_port_wait_time_s=0 (the user's value wins): every start gives up on its GCS at once, as a GCS
    that never starts would; init_ray says what the GCS process did, kills that node's processes, tries once more,
    and then fails naming both."""
    env = {**os.environ, "RAY_gcs_server_port_wait_time_s": "0", "PYTHONPATH": str(REPO)}
    out = _python(GCS_NEVER_UP, env)
    text = out.stdout + out.stderr
    assert "Ray's GCS server did not start (its GCS process (pid" in text, text[-3000:]
    assert "starting a new local instance again (attempt 2 of 2)" in text, text[-3000:]
    assert "ERROR ray.init failed while connecting to a new local Ray instance" in out.stdout, text[-3000:]
    assert "without having published its port after 0 s)" in out.stdout, text[-3000:]
    assert "GCS LEFT []" in out.stdout, text[-3000:]


KEEPS_SIGTERM = """
import signal
from hybridflow.controller import init_ray
def mine(signum, frame):
    pass
signal.signal(signal.SIGTERM, mine)
init_ray({"num_cpus": 1})
print("SIGTERM KEPT", signal.getsignal(signal.SIGTERM) is mine)
import ray
ray.shutdown()
"""


def test_a_start_on_the_main_thread_keeps_the_runs_sigterm_handler():
    """ray.init on the main thread installs Ray's exit-at-once SIGTERM handler; hybridflow's (finish the step,
    checkpoint, exit 143) must stay."""
    out = _python(KEEPS_SIGTERM, {**os.environ, "PYTHONPATH": str(REPO)})
    assert "SIGTERM KEPT True" in out.stdout, (out.stdout + out.stderr)[-3000:]


# ------------------------------------------------------------------------------------------------ leftover cluster
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _python(code: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


GCS = "import ray; print('GCS', ray.get_runtime_context().gcs_address)"


@pytest.fixture
def leftover_cluster():
    """A `ray start --head` cluster left running, with its address file where a bare `ray.init` looks for one.

    ``RAY_TMPDIR`` points Ray's temp dir (and so the address file, ``<dir>/ray/ray_current_cluster``) at a folder of
    this test, so no other Ray user on the machine sees the cluster; ``--block`` keeps the ``ray start`` process as
    the parent of what it starts, and the test stops exactly those processes."""
    import psutil

    tmp = tempfile.mkdtemp(prefix="hfray", dir="/tmp")  # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=tmp, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    ray_cli = str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen([ray_cli, "start", "--head", "--block", f"--port={_free_port()}", "--num-cpus=1",
                             "--include-dashboard=false", f"--ray-client-server-port={_free_port()}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address_file = Path(tmp) / "ray" / "ray_current_cluster"
    started: list = []
    try:
        deadline = time.monotonic() + 120
        while not address_file.exists() or not address_file.read_text().strip():
            assert head.poll() is None and time.monotonic() < deadline, "ray start --head did not come up"
            time.sleep(0.5)
        started = psutil.Process(head.pid).children(recursive=True)
        yield env, address_file.read_text().strip()
    finally:
        head.terminate()  # the blocking `ray start` drains and stops the processes it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        for proc in started:  # anything it left behind, by pid
            if proc.is_running():
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.ray
def test_a_leftover_cluster_is_never_joined_and_a_named_one_is(leftover_cluster):
    env, leftover = leftover_cluster
    # the trap that init_ray avoids: a bare ray.init() joins the leftover (bare on purpose)
    bare = _python(f"import ray; ray.init(); {GCS}", env)  # bare on purpose
    assert f"GCS {leftover}" in bare.stdout, bare.stderr[-2000:]

    private = _python(f"from hybridflow.controller import init_ray; init_ray({{'num_cpus': 1}}); {GCS}", env)
    assert private.returncode == 0, private.stderr[-2000:]
    assert "GCS " in private.stdout and f"GCS {leftover}" not in private.stdout
    assert "hybridflow: started a private Ray instance (1 CPUs)" in private.stderr

    named = _python(f"from hybridflow.controller import init_ray; init_ray({{'address': {leftover!r}}}); {GCS}", env)
    assert f"GCS {leftover}" in named.stdout, named.stderr[-2000:]
    assert f"hybridflow: connected to the Ray cluster at ray_kwargs.ray_init.address='{leftover}'" in named.stderr

    from_env = _python(f"from hybridflow.controller import init_ray; init_ray({{}}); {GCS}",
                       {**env, "RAY_ADDRESS": leftover})
    assert f"GCS {leftover}" in from_env.stdout, from_env.stderr[-2000:]
    assert f"connected to the Ray cluster in RAY_ADDRESS='{leftover}' (unset RAY_ADDRESS" in from_env.stderr


def test_every_ray_start_in_the_repository_asks_for_a_private_instance():
    """A bare ``ray.init(...)`` joins a cluster left in Ray's address file (and then refuses ``num_cpus``): the
    package goes through ``init_ray`` (the one place that decides), and tests pass ``address="local"`` or
    ``address=...`` (a line marked ``bare on purpose`` is exempt)."""
    import re

    offenders = []
    for folder in ("hybridflow", "tests", "examples"):
        for path in (REPO / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                call = re.search(r"\bray\.init\((.*)", line)
                exempt = path.name == "ray_init.py" or "bare on purpose" in line
                if call and "address" not in call.group(1) and not exempt:
                    offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
