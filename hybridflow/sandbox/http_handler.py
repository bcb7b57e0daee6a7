"""One HTTP connection of ``hybridflow sandbox serve``: the checks every request passes (Host, Origin, token,
body framing) and the three endpoints. The server (:mod:`hybridflow.sandbox.http_service`) owns the slots and
the deadlines; the handler tells it when a request has proved its token (:meth:`mark_authenticated`).
"""

from __future__ import annotations

import base64
import hmac
import json
from http.server import BaseHTTPRequestHandler
from typing import Any

MAX_BODY_BYTES = 16 * 1024 * 1024
TOKEN_ENV = "HYBRIDFLOW_SANDBOX_TOKEN"


def sandbox_error(message: str) -> dict[str, Any]:
    """A SandboxFusion answer that says the sandbox (not the program) failed."""
    return {"status": "SandboxError", "message": message, "compile_result": None, "run_result": None,
            "executor_pod_name": None, "files": {}}


class Refused(Exception):
    """A request refused with an HTTP status and a message (and optional headers)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def host_name(header: str) -> str:
    """``Host`` header -> host name without the port (``[::1]:80`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def token_matches(authorization: str, expected: bytes) -> bool:
    """``Authorization: Bearer <token>``, or HTTP Basic auth with the token as password."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.strip().encode(), expected)
    if scheme.lower() == "basic":
        try:
            _, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return hmac.compare_digest(password.encode(), expected)
    return False


class SandboxRequestHandler(BaseHTTPRequestHandler):
    """Set by :func:`make_handler`: ``service``, ``expected_token`` (bytes), ``hosts``, ``timeout``."""

    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # a garbled request line still gets a status line back
    service: Any = None
    expected_token = b""
    hosts: frozenset[str] = frozenset()

    # ---------------------------------------------------------------------------------------- answers
    def _send(self, status: int, body: Any, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code, message=None, explain=None):  # http.server's own refusals, as JSON
        self.close_connection = True
        try:
            text = message or explain or self.responses.get(code, ("",))[0]
            self._send(code, {"status": "Error", "message": text})
        except OSError:
            pass

    def _answer(self, work) -> None:
        try:
            work()
        except Refused as e:
            self.close_connection = True
            self._send(e.status, sandbox_error(e.message), headers=e.headers)
        except OSError:
            self.close_connection = True  # the client went away, or the server dropped the connection
        except Exception as e:  # a status and a message, never a silently dropped connection
            self.close_connection = True
            self._send(500, sandbox_error(f"internal error: {type(e).__name__}: {e}"))

    # ---------------------------------------------------------------------------------------- reading
    def handle_one_request(self):
        self.server.request_started(self.connection)  # the request's deadline and its unauthenticated slot
        super().handle_one_request()

    def parse_request(self) -> bool:
        try:
            return super().parse_request()
        except TimeoutError:
            self.send_error(408, "request headers not received in time")
            return False

    def _check(self, needs_auth: bool = True) -> None:
        host = self.headers.get("Host")
        if host is None or ("*" not in self.hosts and host_name(host) not in self.hosts):
            raise Refused(403, f"Host header {host!r} does not name this server; add it with --allow-host "
                               "if this is intended")
        if self.headers.get("Origin") is not None:
            raise Refused(403, "cross-origin requests (with an Origin header) are refused")
        if needs_auth:
            if not token_matches(self.headers.get("Authorization") or "", self.expected_token):
                raise Refused(401, "missing or wrong token: send 'Authorization: Bearer <token>' (the token "
                                   "`hybridflow sandbox serve` printed, or --token / $" + TOKEN_ENV + ")",
                              {"WWW-Authenticate": 'Bearer realm="hybridflow-sandbox"'})
            if not self.server.request_authenticated(self.connection):
                raise Refused(503, "this connection was dropped by the server (request time-out or eviction)")

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise Refused(411, "chunked bodies are not accepted: send a Content-Length")
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise Refused(411, "a Content-Length header is required")
        if not raw.strip().isdigit():
            raise Refused(400, f"Content-Length {raw!r} is not a non-negative integer")
        length = int(raw)
        if length > MAX_BODY_BYTES:
            raise Refused(413, f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES}")
        try:
            data = self.rfile.read(length)
        except TimeoutError:
            raise Refused(408, f"request body not received within {self.timeout:g} s") from None
        if len(data) != length:
            raise Refused(400, f"request body ended after {len(data)} of {length} bytes")
        self.server.request_received(self.connection)  # running now: no deadline but the program's own
        return data

    # ---------------------------------------------------------------------------------------- endpoints
    def do_GET(self):  # noqa: N802 (http.server's naming)
        self._answer(self._get)

    def _get(self):
        path = self.path.rstrip("/")
        self._check(needs_auth=path != "/v1/ping")
        if path == "/v1/ping":
            self._send(200, "pong", "text/plain")
        elif path == "/health":
            service = self.service
            self._send(200, {"status": "ok", "workers": service.workers, "isolation": service.isolation,
                             "programs_run": service.programs_run})
        else:
            raise Refused(404, f"unknown path {self.path}; POST /run_code")

    def do_POST(self):  # noqa: N802
        self._answer(self._post)

    def _post(self):
        self._check()
        if self.path.rstrip("/") != "/run_code":
            raise Refused(404, f"unknown path {self.path}; POST /run_code")
        body = self._body()
        try:
            request = json.loads(body or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise Refused(400, f"the request body is not JSON: {e}") from None
        status, answer = self.service.run(request)
        self._send(status, answer)

    def do_PUT(self):  # noqa: N802
        self._answer(self._not_allowed)

    do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_PUT  # noqa: N815

    def _not_allowed(self):
        raise Refused(405, f"method {self.command} is not supported; POST /run_code or GET /health")

    def log_message(self, format, *args):  # quiet: one line per request would flood training logs
        pass


def make_handler(service, token: str, hosts: set[str], idle_timeout_s: float) -> type[SandboxRequestHandler]:
    """The handler class of one server: ``timeout`` is the socket's idle time-out per read."""
    return type("Handler", (SandboxRequestHandler,), {
        "service": service, "expected_token": token.encode(), "hosts": frozenset(hosts),
        "timeout": idle_timeout_s})


__all__ = ["MAX_BODY_BYTES", "TOKEN_ENV", "Refused", "SandboxRequestHandler", "host_name", "make_handler",
           "sandbox_error", "token_matches"]
