"""Planted escape attempts against the code sandbox: each must fail, and the host must be unharmed.

Runs in every isolation mode this machine supports ("namespace" needs root; "audit" everywhere), so CI
without root still checks the fallback's promises.
"""

from __future__ import annotations

import os
import socket
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hybridflow.tools.sandbox import SandboxConfig, namespaces_available, run_python

REPO = Path(__file__).resolve().parents[2]
MODES = ["namespace", "audit"] if namespaces_available() else ["audit"]


@pytest.fixture(params=MODES)
def config(request) -> SandboxConfig:
    # A uid range of its own, so that sandboxes run by other test modules at the same time are not counted.
    return SandboxConfig(isolation=request.param, timeout_s=2.0, memory_mb=256, max_processes=16,
                         uid_base=3_000_000, uid_span=1 << 16)


def run(code: str, config: SandboxConfig, **kw):
    return run_python(textwrap.dedent(code), config=config, **kw)


def sandbox_uid_pids(config: SandboxConfig) -> list[int]:
    """Processes still running under the sandbox uid range (must be none once a run returned)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        if config.uid_base <= uid < config.uid_base + config.uid_span:
            pids.append(int(entry))
    return pids


def test_network_loopback_and_external_fail(config):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        for host, p in (("127.0.0.1", port), ("1.1.1.1", 80)):
            result = run(f"""
                import socket
                s = socket.socket()
                s.settimeout(1.5)
                s.connect(({host!r}, {p}))
                print("CONNECTED")
            """, config)
            assert result.status == "fail", (host, result)
            assert "CONNECTED" not in result.stdout
            assert any(e in result.stderr for e in ("unreachable", "PermissionError", "refused")), result.stderr
    finally:
        server.close()


@pytest.mark.parametrize("target", [str(REPO / "pyproject.toml"), "/etc/shadow", "/etc/passwd"])
def test_reading_files_outside_the_sandbox_fails(config, target):
    if target == str(REPO / "pyproject.toml"):
        assert os.path.exists(target)
    result = run(f"print(open({target!r}).read()[:40])", config)
    assert result.status == "fail", result
    assert result.stdout == ""


def test_writing_outside_the_sandbox_fails_but_cwd_is_writable(config, tmp_path):
    victims = [tmp_path / "planted.txt", REPO / "SANDBOX_ESCAPED.txt"]
    code = "\n".join(f"""
try:
    open({str(v)!r}, "w").write("escaped")
    print("WROTE {v.name}")
except OSError as e:
    print("blocked", type(e).__name__)""" for v in victims)
    code += "\nopen('own.txt', 'w').write('mine')\nprint(open('own.txt').read())"
    result = run(code, config)
    assert result.status == "pass", result
    assert "WROTE" not in result.stdout and result.stdout.count("blocked") == 2
    assert result.stdout.strip().endswith("mine")
    assert not any(v.exists() for v in victims)


def test_fork_bomb_is_contained(config):
    result = run("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, config)
    assert result.status in ("timeout", "fail"), result
    assert result.wall_s < config.timeout_s + 3
    assert sandbox_uid_pids(config) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still create processes


def test_spawning_processes_is_limited_and_leaves_nothing_behind(config):
    result = run("""
        import os
        spawned = 0
        try:
            import subprocess  # refused outright in audit mode
            for _ in range(64):
                subprocess.Popen(["sleep", "30"])
                spawned += 1
        except Exception as e:
            print("stopped by", type(e).__name__)
        print("spawned", spawned)
        try:
            print("system", os.system("sleep 30 &"))
        except Exception as e:
            print("system blocked", type(e).__name__)
    """, config)
    assert result.status == "pass", result
    assert "stopped by" in result.stdout
    spawned = int(result.stdout.split("spawned")[1].split()[0])
    assert spawned < config.max_processes
    assert sandbox_uid_pids(config) == []


def test_memory_bomb_reports_memory(config):
    # Generous wall time: touching the pages takes a while on a loaded 2-core CI machine.
    config = SandboxConfig(isolation=config.isolation, timeout_s=15.0, memory_mb=128)
    result = run("""
        chunks = []
        while True:
            chunks.append(bytearray(16 * 1024 * 1024))
    """, config)
    assert result.status == "memory", result
    big = run("x = bytearray(8 * 1024 ** 3)", config)
    assert big.status == "memory", big


def test_infinite_loop_and_sleep_time_out(config):
    config = SandboxConfig(isolation=config.isolation, timeout_s=1.0)
    codes = ("while True: pass", "import time; time.sleep(60)",
             "import os, time\nos.close(1); os.close(2)\ntime.sleep(60)")  # closed pipes: still timed
    with ThreadPoolExecutor(len(codes)) as pool:
        results = list(pool.map(lambda c: run(c, config), codes))
    for code, result in zip(codes, results):
        assert result.status == "timeout", (code, result)
        assert result.wall_s < config.timeout_s + 1.5, (code, result.wall_s)


def test_huge_output_is_truncated(config):
    small = SandboxConfig(isolation=config.isolation, timeout_s=5.0, max_output_bytes=1000)
    result = run("import sys\nsys.stdout.write('x' * 20_000_000)\nsys.stderr.write('e' * 5_000_000 + 'END')",
                 small)
    assert result.status == "pass", result.stderr[-300:]
    assert result.stdout_truncated and result.stderr_truncated
    assert result.stdout.startswith("x" * 1000) and len(result.stdout) < 1100
    assert result.stderr.endswith("END") and len(result.stderr) < 1100  # stderr keeps the tail


def test_killing_the_parent_fails(config):
    me = os.getpid()
    result = run(f"""
        import os, signal
        for target in ({me}, os.getppid()):
            try:
                os.kill(target, signal.SIGKILL)
                print("sent", target)
            except Exception as e:
                print("blocked", type(e).__name__)
        try:
            os.killpg({os.getpgid(me)}, signal.SIGKILL)
        except Exception as e:
            print("blocked", type(e).__name__)
    """, config)
    assert result.status in ("pass", "fail"), result
    assert f"sent {me}" not in result.stdout
    os.kill(me, 0)  # still alive (trivially, since we are running)


def test_environment_is_clean(config, monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_SECRET_TOKEN", "do-not-leak")
    result = run("import os; print(sorted(os.environ)); print(os.environ.get('HYBRIDFLOW_SECRET_TOKEN'))", config)
    assert result.status == "pass", result
    assert "do-not-leak" not in result.stdout


@pytest.mark.skipif("namespace" not in MODES, reason="needs root for namespaces")
def test_namespace_mode_runs_unprivileged_in_a_private_root():
    cfg = SandboxConfig(isolation="namespace", timeout_s=3.0)
    result = run("""
        import os
        print(os.getuid() != 0, os.getpid())
        print(sorted(os.listdir("/")))
        try:
            os.setuid(0)
            print("ROOT")
        except PermissionError:
            print("no-root")
    """, cfg)
    assert result.status == "pass", result
    lines = result.stdout.splitlines()
    assert lines[0] == "True 1"  # unprivileged, PID 1 of its own namespace
    assert "work" not in lines[1] and "home" not in lines[1] and "sandbox" in lines[1]
    assert lines[2] == "no-root"
