"""The stall watchdog of server replicas (processes hybridflow started): token progress read from ``/metrics``.

A server replica is reached over HTTP by clients in other processes (agent-loop workers), so nothing in the
trainer sees its requests.  The server itself counts them: vLLM's Prometheus endpoint has the requests
running and waiting (``vllm:num_requests_running`` / ``_waiting``) and the prompt and generated tokens so far
(``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total``).  :class:`ServerWatch` (one daemon thread
per fleet) reads them every few seconds; a server that has requests and whose token counters have not moved
for ``actor_rollout_ref.rollout.stall_timeout_s`` is stopped -- its clients' requests then fail at once --
and the error naming it, its request counts and how long it has been stuck is kept for the fleet's
``explain`` / ``check`` (what the run stops with).
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from typing import Callable, Sequence

from hybridflow.rollout.service.watchdog import STALL_TIMEOUT_KEY, GenerationStalled

__all__ = ["ServerWatch", "parse_metrics"]

_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})?\s+([-+0-9.eEinfINFnaN]+)\s*$")
_RUNNING, _WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
_TOKENS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {metric name: value summed over its label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match and not line.startswith("#"):
            out[match.group(1)] = out.get(match.group(1), 0.0) + float(match.group(2))
    return out


def _read(url: str, timeout_s: float = 2.0) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as resp:
            return parse_metrics(resp.read().decode(errors="replace"))
    except (OSError, ValueError):
        return None  # not up (yet), or gone: the fleet's health check reports a dead process


class ServerWatch:
    """Watches ``servers`` (objects with ``name``, ``url``, ``alive()``, ``stop()``); ``timeout_s <= 0`` disables."""

    def __init__(self, servers: Sequence, timeout_s: float, read: Callable[[str], dict | None] = _read):
        self.servers = list(servers)
        self.timeout_s = float(timeout_s)
        self._read = read
        self._last: dict[str, tuple[tuple, float]] = {}
        self.stalled: dict[str, GenerationStalled] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "ServerWatch":
        if self.timeout_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="server-replica-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(max(self.timeout_s / 8, 0.05), 5.0)):
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        for server in self.servers:
            if server.name in self.stalled or not server.alive():
                continue
            metrics = self._read(server.url)
            if metrics is None:
                continue
            waiting = metrics.get(_RUNNING, 0.0) + metrics.get(_WAITING, 0.0)
            signature = tuple(metrics.get(k, 0.0) for k in _TOKENS)
            last = self._last.get(server.name)
            if waiting <= 0 or last is None or last[0] != signature:
                self._last[server.name] = (signature, now)
                continue
            if now - last[1] >= self.timeout_s:
                self.stalled[server.name] = GenerationStalled(
                    f"rollout replica '{server.name}' ({server.url}) made no progress for {now - last[1]:.1f} s with "
                    f"{metrics.get(_RUNNING, 0.0):.0f} request(s) running and {metrics.get(_WAITING, 0.0):.0f} "
                    f"waiting: no prompt or generated token (its vLLM counters stood at {signature[0]:.0f} prompt and "
                    f"{signature[1]:.0f} generated tokens).  The server was stopped, so its requests fail now.  If "
                    f"its steps legitimately take this long, raise {STALL_TIMEOUT_KEY}={self.timeout_s:g} (0 "
                    "disables the watchdog).")
                server.stop()
