"""Client of the SandboxFusion HTTP API (``POST /run_code``), the remote sandbox verl's code rewards and tool call.

Request (JSON): ``code``, ``language`` ("python"), ``stdin``, ``compile_timeout``, ``run_timeout`` (s),
``memory_limit_MB``, ``files`` ({}), ``fetch_files`` ([]). Response: ``status`` ("Success" | "Failed" |
"SandboxError"), ``message``, ``compile_result`` and ``run_result`` (each null or ``{status: "Finished" |
"TimeLimitExceeded" | "Error", execution_time, return_code, stdout, stderr}``), ``executor_pod_name``,
``files``. :func:`run_code_remote` maps the answer onto the local sandbox's :class:`SandboxResult`, so a
scorer or tool runs code the same way locally or remotely; ``hybridflow sandbox serve`` is a server for it.

A 502/503/504 answer or a refused connection is retried (``max_retries`` times, 1 s, 2 s, ... apart); when the
service stays unreachable :class:`SandboxFusionError` is raised, so the caller counts an error instead of
scoring the program 0.

Authentication: a token in the URL's password (``http://:TOKEN@host:port/run_code``, what
``hybridflow sandbox serve`` prints) or in ``$HYBRIDFLOW_SANDBOX_TOKEN`` is sent as ``Authorization: Bearer``;
the token never appears in error messages.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from hybridflow.sandbox.limits import SandboxResult

_RETRY_STATUS = (502, 503, 504)
_REQUEST_OVERHEAD_S = 10.0


class SandboxFusionError(RuntimeError):
    """The sandbox service could not be reached or did not answer in its API's shape."""


TOKEN_ENV = "HYBRIDFLOW_SANDBOX_TOKEN"


def _split_token(url: str) -> tuple[str, str | None]:
    """``http://:TOKEN@host:port/x`` -> (``http://host:port/x``, ``TOKEN``); no password -> (url, None)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    _, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=hostport)), (password or None)


def run_code_url(url: str) -> str:
    """``http://host:port`` -> ``http://host:port/run_code``; a URL that names an endpoint is kept (a token in
    the URL is kept too)."""
    bare, _ = _split_token(url)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not urlsplit(bare).netloc:
        shown = bare if bare != url else url
        raise ValueError(f"sandbox_fusion url {shown!r} must be an http(s) URL such as http://127.0.0.1:8080/run_code")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/run_code")
    return urlunsplit(parts)


def _result_from_response(data: dict) -> SandboxResult:
    if not isinstance(data, dict) or "status" not in data:
        raise SandboxFusionError(f"sandbox service answered without a 'status': {str(data)[:200]!r}")
    api_status = data["status"]
    run = data.get("run_result") or {}
    compile_ = data.get("compile_result") or {}
    stdout, stderr = run.get("stdout") or "", run.get("stderr") or compile_.get("stderr") or ""
    wall = float(run.get("execution_time") or 0.0) + float(compile_.get("execution_time") or 0.0)
    rc = run.get("return_code")
    if api_status == "SandboxError":
        return SandboxResult("error", None, stdout, stderr or str(data.get("message") or "sandbox error"), wall)
    if compile_.get("status") == "TimeLimitExceeded" or run.get("status") == "TimeLimitExceeded":
        return SandboxResult("timeout", rc, stdout, stderr, wall)
    if compile_ and (compile_.get("status") == "Error" or compile_.get("return_code") not in (None, 0)):
        return SandboxResult("fail", compile_.get("return_code"), stdout, stderr, wall)
    if run.get("status") == "Finished":
        if api_status == "Success" and rc == 0:
            return SandboxResult("pass", 0, stdout, stderr, wall)
        status = "memory" if stderr.rstrip().endswith("MemoryError") else "fail"
        return SandboxResult(status, rc, stdout, stderr, wall)
    if run.get("status") == "Error":
        return SandboxResult("error", rc, stdout, stderr or "the sandbox service could not run the program", wall)
    raise SandboxFusionError(f"sandbox service answered status={api_status!r} without a usable run_result: "
                             f"{str(data)[:200]!r}")


_WEAK_SERVICES: set[str] = set()
_WEAK_LOCK = threading.Lock()


def _warn_weak_service(endpoint: str) -> None:
    """Say once per service that it runs model-written code with no OS isolation (``--isolation audit``)."""
    with _WEAK_LOCK:
        if endpoint in _WEAK_SERVICES:
            return
        _WEAK_SERVICES.add(endpoint)
    print(f"hybridflow sandbox: WARNING: the sandbox service {endpoint} runs model-written code with "
          "isolation=audit (NO OS ISOLATION: a Python audit hook only); restart it without --isolation audit "
          "unless the code is trusted (docs/sandbox.md)", file=sys.stderr, flush=True)


def run_code_remote(url: str, code: str, stdin: str = "", timeout_s: float = 10.0, memory_mb: int = 1024,
                    language: str = "python", max_retries: int = 3) -> SandboxResult:
    """Run ``code`` on the SandboxFusion service at ``url`` (blocking; thread-safe)."""
    payload = json.dumps({"code": code, "language": language, "stdin": stdin, "compile_timeout": timeout_s,
                          "run_timeout": timeout_s, "memory_limit_MB": memory_mb, "files": {},
                          "fetch_files": []}).encode()
    endpoint, token = _split_token(run_code_url(url))
    token = token or os.environ.get(TOKEN_ENV)
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    last = "no attempt"
    for attempt in range(max(1, max_retries)):
        if attempt:
            time.sleep(float(attempt))
        request = urllib.request.Request(endpoint, data=payload, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=2 * timeout_s + _REQUEST_OVERHEAD_S) as response:
                body = response.read()
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code} {e.reason}"
            if e.code in _RETRY_STATUS:
                continue
            detail = e.read()[:300].decode("utf-8", "replace")
            hint = ""
            if e.code == 401:
                hint = (" -- give the server's token in the URL (http://:TOKEN@host:port/run_code) or in $"
                        + TOKEN_ENV)
            raise SandboxFusionError(f"sandbox service {endpoint} answered {last}: {detail}{hint}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            continue
        try:
            data = json.loads(body)
            result = _result_from_response(data)
        except json.JSONDecodeError:
            raise SandboxFusionError(f"sandbox service {endpoint} answered non-JSON: {body[:200]!r}") from None
        result.isolation = str(data.get("isolation") or "remote")  # hybridflow's server says which mode ran it
        if result.isolation == "audit":
            _warn_weak_service(endpoint)
        return result
    raise SandboxFusionError(f"sandbox service {endpoint} unreachable after {max(1, max_retries)} attempt(s): {last}")


_PERMITS: dict[tuple[int, int], threading.BoundedSemaphore] = {}
_PERMITS_LOCK = threading.Lock()
_TOKENS = itertools.count()


@dataclass(frozen=True)
class ConcurrencyLimit:
    """At most ``permits`` requests at a time in each process that uses it; picklable (verl passes a
    ``concurrent_semaphore`` to scorers that run in worker processes). Use as ``with limit: ...``."""

    permits: int
    token: int = -1

    def __post_init__(self):
        if self.permits < 1:
            raise ValueError(f"ConcurrencyLimit needs at least 1 permit, got {self.permits}")
        if self.token < 0:
            object.__setattr__(self, "token", next(_TOKENS))

    def _semaphore(self) -> threading.BoundedSemaphore:
        key = (self.token, self.permits)
        with _PERMITS_LOCK:
            if key not in _PERMITS:
                _PERMITS[key] = threading.BoundedSemaphore(self.permits)
            return _PERMITS[key]

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        return self._semaphore().acquire(blocking, timeout)

    def release(self) -> None:
        self._semaphore().release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


__all__ = ["ConcurrencyLimit", "SandboxFusionError", "run_code_remote", "run_code_url"]
