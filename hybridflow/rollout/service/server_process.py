"""A server process hybridflow starts and owns: own process group, log file, health check, stop by pid.

Used by the vLLM server replicas and the SGLang engine.  Only the process group this object started is ever
signalled (``start_new_session=True`` makes the server's pid its group id), so stopping never touches anyone
else's processes.  A start failure, a time-out or a death is a :class:`ServerProcessError` (subclassed per
engine) whose message names the server and ends with the tail of its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from hybridflow.rollout.service.replica import ReplicaError

__all__ = ["ServerProcess", "ServerProcessError", "free_port", "http_json"]


class ServerProcessError(ReplicaError):
    """A server replica failed to start, died, or answered with an error; the message names it."""


# vLLM / SGLang prefix every log line with "(Process pid=N) LEVEL date time [file:line] "
_LOG_PREFIX = re.compile(r"^\([^)]*\)\s+(?:[A-Z]+\s+\S+\s+\S+\s+\[[^\]]*\]\s?)?")
_TRACEBACK_LINES = 60


def first_traceback(text: str) -> str | None:
    """The first Python traceback in a server log (its root cause: later ones are usually its consequences),
    prefixes stripped; None when the log holds none."""
    lines = [_LOG_PREFIX.sub("", line) for line in text.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), None)
    if start is None:
        return None
    out = [lines[start]]
    for line in lines[start + 1:start + _TRACEBACK_LINES]:
        out.append(line)
        if line and not line[0].isspace() and not line.startswith(("Traceback", "During handling", "The above")):
            break  # the exception line ends the block
    return "\n".join(out)


def free_port(host: str = "127.0.0.1") -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_json(url: str, payload: dict | None = None, timeout: float = 60.0, method: str | None = None,
              headers: dict[str, str] | None = None) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if body.strip() else None


class ServerProcess:
    """One HTTP server process: :meth:`command` (subclasses) is started, ready when ``health_path`` answers 200."""

    kind = "server"
    error_type: type[ServerProcessError] = ServerProcessError
    health_path = "/health"

    def __init__(self, name: str, host: str = "127.0.0.1", port: int | None = None, log_dir: str | None = None,
                 env: dict[str, str] | None = None, start_timeout_s: float = 300.0):
        self.name = name
        self.host = host
        self.port = port
        self.log_dir = log_dir
        self.extra_env = dict(env or {})
        self.auth_headers: dict[str, str] = {}  # sent with every post() (a replica's per-run key)
        self.start_timeout_s = float(start_timeout_s)
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self._log_file = None
        self.start_seconds = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.extra_env}

    # ------------------------------------------------------------------ start / health / stop
    def start(self):
        """Start the server and wait until it is healthy; on failure it is stopped and the error carries the
        log tail."""
        if self.proc is not None:
            raise RuntimeError(f"{self.kind} '{self.name}' was already started (pid {self.proc.pid})")
        if self.port is None:
            self.port = free_port(self.host)
        folder = Path(self.log_dir) if self.log_dir else Path(tempfile.mkdtemp(prefix="hybridflow-server-"))
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / f"{self.name}.log"
        self._log_file = open(self.log_path, "ab")
        start = time.perf_counter()
        self.proc = subprocess.Popen(self.command(), stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.environment(), start_new_session=True)
        try:
            self._wait_healthy(start)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - start
        return self

    def _wait_healthy(self, start: float) -> None:
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self.error_type(f"{self.kind} '{self.name}' exited with code {code} while starting "
                                      f"({self.log_path}); last log lines:\n{self.log_tail()}")
            if self.healthy(timeout=2.0):
                return
            if time.perf_counter() - start > self.start_timeout_s:
                raise self.error_type(f"{self.kind} '{self.name}' did not become healthy within "
                                      f"{self.start_timeout_s:.0f}s ({self.log_path}); last log lines:\n"
                                      f"{self.log_tail()}")
            time.sleep(0.5)

    def healthy(self, timeout: float = 5.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}{self.health_path}", timeout=timeout) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise naming this replica if its process has exited."""
        if self.proc is None:
            raise self.error_type(f"{self.kind} '{self.name}' was never started")
        code = self.proc.poll()
        if code is not None:
            raise self.error_type(f"{self.kind} replica '{self.name}' ({self.url}, pid {self.proc.pid}) died with "
                                  f"exit code {code} ({self.log_path}); {self.log_excerpt()}")

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_bytes()[-64_000:].decode(errors="replace").splitlines()
        return "\n".join(text[-lines:]) or "(empty log)"

    def log_excerpt(self, lines: int = 12) -> str:
        """What to show of the log after a failure: its first traceback (the root cause) and the last lines."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        found = first_traceback(self.log_path.read_bytes()[-256_000:].decode(errors="replace"))
        tail = self.log_tail(lines)
        return tail if found is None else f"first error in the log:\n{found}\nlast log lines:\n{tail}"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the process group this object started, SIGKILL after ``timeout``; idempotent."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # start_new_session: the group id is the server's pid
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    # ------------------------------------------------------------------ control plane
    def post(self, path: str, payload: dict | None = None, timeout: float = 300.0) -> Any:
        self.check_alive()
        try:
            return http_json(f"{self.url}{path}", payload if payload is not None else {}, timeout=timeout,
                             headers=self.auth_headers)
        except urllib.error.HTTPError as e:
            raise self.error_type(f"{self.kind} '{self.name}' answered {e.code} to {path}: "
                                  f"{e.read()[:2000].decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            self.check_alive()
            raise self.error_type(f"{self.kind} '{self.name}' ({self.url}) did not answer {path}: {e}") from None
