"""``hybridflow sandbox serve``: the SandboxFusion HTTP API on top of the local sandbox.

Code rewards (``reward_model.sandbox_fusion.url``) and the code interpreter tool (``sandbox_fusion_url``) can
then run model-written code in another process or on another machine, exactly as verl users point them at a
SandboxFusion deployment. Endpoints:

* ``POST /run_code`` -- request/response as documented in :mod:`hybridflow.tools.sandbox_fusion_client`;
  ``language`` must be ``python`` (or ``python3``); ``files``/``fetch_files`` must be empty. Each program runs in
  :func:`hybridflow.tools.sandbox.run_python` with ``run_timeout`` and ``memory_limit_MB`` clamped to the
  server's ``--max-timeout`` / ``--max-memory-mb``; at most ``--workers`` programs run at once (others queue).
* ``GET /v1/ping`` -> ``pong``; ``GET /health`` -> ``{"status": "ok", ...}``.

The server binds ``127.0.0.1`` unless told otherwise: it runs arbitrary code (sandboxed, but still), so expose
it on a network only behind your own access control.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hybridflow.tools.sandbox import SandboxConfig, SandboxResult, resolve_isolation, run_python

MAX_BODY_BYTES = 16 * 1024 * 1024
_PYTHON = ("python", "python3")


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
            "executor_pod_name": None, "files": {}}


def _sandbox_error(message: str) -> dict[str, Any]:
    return {"status": "SandboxError", "message": message, "compile_result": None, "run_result": None,
            "executor_pod_name": None, "files": {}}


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
            return 400, _sandbox_error("the request body must be a JSON object")
        code = request.get("code")
        if not isinstance(code, str):
            return 400, _sandbox_error("'code' (a string) is required")
        language = request.get("language") or "python"
        if language not in _PYTHON:
            return 200, _sandbox_error(f"language {language!r} is not supported by hybridflow's sandbox (python only)")
        if request.get("files") or request.get("fetch_files"):
            return 200, _sandbox_error("'files' and 'fetch_files' are not supported by hybridflow's sandbox")
        stdin = request.get("stdin") or ""
        try:
            timeout = float(request.get("run_timeout") or 10.0)
            memory = int(request.get("memory_limit_MB") or 1024)
        except (TypeError, ValueError):
            return 400, _sandbox_error("'run_timeout' and 'memory_limit_MB' must be numbers")
        if not isinstance(stdin, str) or timeout <= 0 or memory < 32:
            return 400, _sandbox_error("'stdin' must be a string, 'run_timeout' > 0 and 'memory_limit_MB' >= 32")
        with self._slots:
            result = run_python(code, stdin=stdin, timeout_s=min(timeout, self.max_timeout_s),
                                memory_mb=min(memory, self.max_memory_mb), config=self.base)
        with self._count_lock:
            self.programs_run += 1
        return 200, response_for(result)


def _handler(service: SandboxService):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path.rstrip("/") == "/v1/ping":
                self._send(200, "pong", "text/plain")
            elif self.path.rstrip("/") == "/health":
                self._send(200, {"status": "ok", "workers": service.workers, "isolation": service.isolation,
                                 "programs_run": service.programs_run})
            else:
                self._send(404, {"error": f"unknown path {self.path}; POST /run_code"})

        def do_POST(self):  # noqa: N802
            if self.path.rstrip("/") != "/run_code":
                self._send(404, {"error": f"unknown path {self.path}; POST /run_code"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                self._send(413, _sandbox_error(f"request body over {MAX_BODY_BYTES} bytes"))
                return
            try:
                request = json.loads(self.rfile.read(length) or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                self._send(400, _sandbox_error(f"the request body is not JSON: {e}"))
                return
            status, body = service.run(request)
            self._send(status, body)

        def log_message(self, format, *args):  # quiet: one line per request would flood training logs
            pass

    return Handler


def make_server(host: str = "127.0.0.1", port: int = 8080, **service_kwargs) -> ThreadingHTTPServer:
    """A ready-to-serve HTTP server (``port=0`` picks a free port: ``server.server_address[1]``)."""
    service = SandboxService(**service_kwargs)
    server = ThreadingHTTPServer((host, port), _handler(service))
    server.daemon_threads = True
    server.service = service
    return server


def serve_in_thread(host: str = "127.0.0.1", port: int = 0, **service_kwargs) -> tuple[ThreadingHTTPServer, str]:
    """Start a server on a background thread; returns it (``.shutdown()`` to stop; ``.service.programs_run``
    counts the programs it ran) and its ``/run_code`` URL."""
    server = make_server(host, port, **service_kwargs)
    threading.Thread(target=server.serve_forever, name="hybridflow-sandbox-server", daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}/run_code"


def setup_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8080, help="port (0 picks a free one; default 8080)")
    parser.add_argument("--workers", type=int, default=4, help="programs run at once (default 4)")
    parser.add_argument("--max-timeout", type=float, default=60.0, help="cap on a request's run_timeout in s")
    parser.add_argument("--max-memory-mb", type=int, default=4096, help="cap on a request's memory_limit_MB")
    parser.add_argument("--isolation", default="auto", choices=["auto", "namespace", "audit"],
                        help="sandbox mode (see docs/sandbox.md)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridflow sandbox serve",
                                     description="Serve the SandboxFusion API (/run_code) on the local sandbox.")
    setup_parser(parser)
    args = parser.parse_args(argv)
    server = make_server(args.host, args.port, workers=args.workers, max_timeout_s=args.max_timeout,
                         max_memory_mb=args.max_memory_mb, isolation=args.isolation)
    host, port = server.server_address[:2]
    print(f"hybridflow sandbox: serving the SandboxFusion API on http://{host}:{port}/run_code "
          f"({args.workers} workers, isolation={server.service.isolation})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
