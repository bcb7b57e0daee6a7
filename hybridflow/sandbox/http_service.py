"""``hybridflow sandbox serve``: the SandboxFusion HTTP API on top of the local sandbox, safe by default.

Code rewards (``reward_model.sandbox_fusion.url``) and the code interpreter tool (``sandbox_fusion_url``) can
then run model-written code in another process or on another machine, as verl users point them at a
SandboxFusion deployment. Endpoints:

* ``POST /run_code`` -- request/response as documented in :mod:`hybridflow.sandbox.fusion_client`;
  ``language`` must be ``python`` (or ``python3``); ``files``/``fetch_files`` must be empty. Each program runs in
  :func:`hybridflow.sandbox.run_python` with ``run_timeout`` and ``memory_limit_MB`` clamped to the server's
  ``--max-timeout`` / ``--max-memory-mb``; at most ``--workers`` programs run at once (others queue).
* ``GET /health`` -> ``{"status": "ok", ...}``; ``GET /v1/ping`` -> ``pong`` (the only unauthenticated path).

It runs arbitrary code, so by default it is reachable only by this machine's own, authenticated clients:

* binds ``127.0.0.1`` (``--host`` to change it, for a cluster);
* every request except ``/v1/ping`` needs ``Authorization: Bearer <token>`` (or HTTP Basic auth with the
  token as password, which is what ``http://:TOKEN@host:port`` URLs send); the token is ``--token``,
  ``$HYBRIDFLOW_SANDBOX_TOKEN``, or generated and printed at start;
* the ``Host`` header must name this server (loopback names, the bound address, ``--allow-host``) and requests
  carrying an ``Origin`` header are refused: a web page in the user's browser cannot reach it (DNS rebinding,
  cross-site ``text/plain`` POSTs);
* bodies need a valid ``Content-Length`` (missing -> 411, negative or not a number -> 400, over 16 MiB -> 413,
  chunked -> 411); a connection idle for ``--idle-timeout`` seconds (default 30) is closed (408 when a request
  was half sent), and a request must arrive whole within ``--request-timeout`` seconds (default 60) however it
  trickles in (408); at most ``--max-connections`` (512) are served at once, connections that have not sent the
  token yet hold at most ``--max-unauthenticated`` of them (half; over it the oldest is dropped with 503), so
  slow clients cannot starve an authenticated one; the listen backlog is 1024. Every refused request gets a
  status and a JSON ``message``.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import secrets
import socket
import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from hybridflow.sandbox.http_connections import ConnectionTable, drop, http_answer
from hybridflow.sandbox.http_handler import (  # noqa: F401 (MAX_BODY_BYTES is re-exported)
    MAX_BODY_BYTES,
    TOKEN_ENV,
    make_handler,
    sandbox_error,
)
from hybridflow.sandbox.limits import SandboxConfig, SandboxResult
from hybridflow.sandbox.modes import SandboxUnavailable, resolve_isolation
from hybridflow.sandbox.run import run_python

LISTEN_BACKLOG = 1024
_PYTHON = ("python", "python3")
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def _run_result(result: SandboxResult) -> dict[str, Any]:
    status = {"timeout": "TimeLimitExceeded", "error": "Error"}.get(result.status, "Finished")
    return {"status": status, "execution_time": round(result.wall_s, 4), "return_code": result.returncode,
            "stdout": result.stdout, "stderr": result.stderr}


def response_for(result: SandboxResult) -> dict[str, Any]:
    """The SandboxFusion answer for a finished local run."""
    if result.status == "error":
        api_status, message = "SandboxError", result.stderr[-500:]
    else:
        api_status, message = ("Success", "") if result.status == "pass" else ("Failed", "")
    return {"status": api_status, "message": message, "compile_result": None, "run_result": _run_result(result),
            "executor_pod_name": None, "files": {}, "isolation": result.isolation}


def _number(request: dict, key: str, default: float) -> float | None:
    value = request.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


class SandboxService:
    """Validates requests and runs them, ``workers`` at a time."""

    def __init__(self, workers: int = 4, max_timeout_s: float = 60.0, max_memory_mb: int = 4096,
                 isolation: str = "auto"):
        if workers < 1:
            raise ValueError(f"--workers must be >= 1, got {workers}")
        self.base = SandboxConfig(timeout_s=max_timeout_s, memory_mb=max_memory_mb, isolation=isolation)
        self.isolation = resolve_isolation(self.base)
        self.max_timeout_s = max_timeout_s
        self.max_memory_mb = max_memory_mb
        self.workers = workers
        self._slots = threading.BoundedSemaphore(workers)
        self._count_lock = threading.Lock()
        self.programs_run = 0

    def run(self, request: Any) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON answer) for one ``/run_code`` body."""
        if not isinstance(request, dict):
            return 400, sandbox_error("the request body must be a JSON object")
        code = request.get("code")
        if not isinstance(code, str):
            return 400, sandbox_error("'code' (a string) is required")
        language = request.get("language") or "python"
        if language not in _PYTHON:
            return 200, sandbox_error(f"language {language!r} is not supported by hybridflow's sandbox (python only)")
        if request.get("files") or request.get("fetch_files"):
            return 200, sandbox_error("'files' and 'fetch_files' are not supported by hybridflow's sandbox")
        stdin = request.get("stdin") or ""
        timeout = _number(request, "run_timeout", 10.0)
        memory = _number(request, "memory_limit_MB", 1024)
        if timeout is None or memory is None:
            return 400, sandbox_error("'run_timeout' and 'memory_limit_MB' must be finite numbers")
        if not isinstance(stdin, str) or timeout <= 0 or memory < 32:
            return 400, sandbox_error("'stdin' must be a string, 'run_timeout' > 0 and 'memory_limit_MB' >= 32")
        with self._slots:
            result = run_python(code, stdin=stdin, timeout_s=min(timeout, self.max_timeout_s),
                                memory_mb=int(min(memory, self.max_memory_mb)), config=self.base)
        with self._count_lock:
            self.programs_run += 1
        return 200, response_for(result)


def allowed_hosts(bind_host: str, extra: list[str] | tuple[str, ...] = ()) -> set[str]:
    """Host names a request may carry: loopback names, the bound address, this machine's names when bound to
    every interface, and ``extra`` (``*`` allows any)."""
    names = {n.strip("[]") for n in _LOOPBACK_NAMES} | {h.lower().strip("[]") for h in extra}
    bind = bind_host.strip("[]").lower()
    names.add(bind)
    if bind in ("", "0.0.0.0", "::"):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return names


class SandboxHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once, with a deep listen backlog. Each request must
    arrive whole within ``request_timeout_s`` and unauthenticated connections hold at most ``max_unauthenticated``
    slots (:mod:`hybridflow.sandbox.http_connections`); more than that gets 503."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, handler, max_connections: int = 512, max_unauthenticated: int | None = None,
                 request_timeout_s: float = 60.0):
        self.max_connections = max_connections
        self.connections = ConnectionTable(max_connections, max_unauthenticated or max(1, max_connections // 2),
                                           request_timeout_s)
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, handler)
        self._closed = threading.Event()
        threading.Thread(target=self._reap, name="hybridflow-sandbox-reaper", daemon=True).start()

    def _reap(self) -> None:
        """Cut the connections whose request is late (408), four times per request time-out at least."""
        interval = min(0.25, self.connections.request_timeout_s / 4)
        timeout = self.connections.request_timeout_s
        answer = http_answer(408, "Request Timeout", sandbox_error(
            f"request not received whole within {timeout:g} s (--request-timeout)"))
        while not self._closed.wait(interval):
            for sock in self.connections.late():
                drop(sock, answer)

    def process_request(self, request, client_address):
        admitted, victims = self.connections.admit(request)
        evicted = http_answer(503, "Service Unavailable", sandbox_error(
            "connection dropped: too many connections have not sent the token yet (--max-unauthenticated "
            f"{self.connections.max_unauthenticated})"))
        for victim in victims:
            drop(victim, evicted)
        if not admitted:
            drop(request, http_answer(503, "Service Unavailable", sandbox_error(
                f"server busy: {self.max_connections} authenticated requests running")))
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.remove(request)

    def request_started(self, sock) -> None:
        self.connections.request_started(sock)

    def request_authenticated(self, sock) -> bool:
        return self.connections.request_authenticated(sock)

    def request_received(self, sock) -> None:
        self.connections.request_received(sock)

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()


def make_server(host: str = "127.0.0.1", port: int = 8080, token: str | None = None,
                allow_hosts: list[str] | tuple[str, ...] = (), idle_timeout_s: float = 30.0,
                max_connections: int = 512, max_unauthenticated: int | None = None, request_timeout_s: float = 60.0,
                **service_kwargs) -> SandboxHTTPServer:
    """A ready-to-serve HTTP server (``port=0`` picks a free port: ``server.server_address[1]``).

    ``token`` defaults to ``$HYBRIDFLOW_SANDBOX_TOKEN``, else a random one (``server.token``);
    ``max_unauthenticated`` defaults to half of ``max_connections``."""
    token = token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)
    if not idle_timeout_s > 0:
        raise ValueError(f"--idle-timeout must be > 0 seconds, got {idle_timeout_s}")
    service = SandboxService(**service_kwargs)
    handler = make_handler(service, token, allowed_hosts(host, allow_hosts), idle_timeout_s)
    server = SandboxHTTPServer((host, port), handler, max_connections=max_connections,
                               max_unauthenticated=max_unauthenticated, request_timeout_s=request_timeout_s)
    server.service = service
    server.token = token
    return server


def server_url(server: SandboxHTTPServer, with_token: bool = True) -> str:
    """``http://:TOKEN@host:port/run_code`` (the client sends the token from the URL)."""
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in host else host
    if shown in ("0.0.0.0", "[::]"):
        shown = "127.0.0.1"
    auth = f":{server.token}@" if with_token else ""
    return f"http://{auth}{shown}:{port}/run_code"


def serve_in_thread(host: str = "127.0.0.1", port: int = 0, **kwargs) -> tuple[SandboxHTTPServer, str]:
    """Start a server on a background thread; returns it (``.shutdown()`` to stop; ``.service.programs_run``
    counts the programs it ran) and its ``/run_code`` URL with the token in it."""
    server = make_server(host, port, **kwargs)
    threading.Thread(target=server.serve_forever, name="hybridflow-sandbox-server", daemon=True).start()
    return server, server_url(server)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def setup_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8080, help="port (0 picks a free one; default 8080)")
    parser.add_argument("--token", default=None,
                        help=f"the token clients must send (default: ${TOKEN_ENV}, else a random one, printed)")
    parser.add_argument("--allow-host", action="append", default=[],
                        help="another name clients may use in the Host header (repeatable; '*' for any)")
    parser.add_argument("--workers", type=int, default=4, help="programs run at once (default 4)")
    parser.add_argument("--max-timeout", type=float, default=60.0, help="cap on a request's run_timeout in s")
    parser.add_argument("--max-memory-mb", type=int, default=4096, help="cap on a request's memory_limit_MB")
    parser.add_argument("--idle-timeout", type=float, default=30.0, help="close connections idle this long (s)")
    parser.add_argument("--max-connections", type=int, default=512, help="connections served at once")
    parser.add_argument("--max-unauthenticated", type=int, default=None,
                        help="slots that connections without the token yet may hold (default: half of "
                             "--max-connections); over it the oldest such connection is dropped")
    parser.add_argument("--request-timeout", type=float, default=60.0,
                        help="a request must arrive whole (headers and body) within this many seconds (default 60)")
    parser.add_argument("--isolation", default="auto", choices=["auto", "namespace", "bwrap", "userns", "audit"],
                        help="sandbox mode (see docs/sandbox.md; 'audit' is weak and must be asked for)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridflow sandbox serve",
                                     description="Serve the SandboxFusion API (/run_code) on the local sandbox.")
    setup_parser(parser)
    args = parser.parse_args(argv)
    given = args.token or os.environ.get(TOKEN_ENV)
    try:
        server = make_server(args.host, args.port, token=given, allow_hosts=args.allow_host,
                             idle_timeout_s=args.idle_timeout, max_connections=args.max_connections,
                             max_unauthenticated=args.max_unauthenticated, request_timeout_s=args.request_timeout,
                             workers=args.workers, max_timeout_s=args.max_timeout, max_memory_mb=args.max_memory_mb,
                             isolation=args.isolation)
    except (SandboxUnavailable, ValueError, OSError) as e:
        print(f"hybridflow sandbox: {e}", file=sys.stderr)
        return 1
    print(f"hybridflow sandbox: serving the SandboxFusion API on {server_url(server, with_token=False)} "
          f"({args.workers} workers, isolation={server.service.isolation})", flush=True)
    if given:
        print("hybridflow sandbox: clients must send the token you gave (Authorization: Bearer ...)", flush=True)
    else:
        print(f"hybridflow sandbox: token {server.token}  (clients: reward_model.sandbox_fusion.url="
              f"{server_url(server)} or export {TOKEN_ENV}={server.token})", flush=True)
    if not _is_loopback(args.host):
        print(f"hybridflow sandbox: bound to {args.host}: reachable from the network; every request still needs "
              "the token", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
