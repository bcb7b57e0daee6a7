"""ASGI middleware hybridflow adds to the vLLM server replicas it starts (``--middleware``; runs inside vLLM's
server process, so it imports nothing else from hybridflow).

vLLM's own ``--api-key`` guards only ``/v1/...``, and the endpoints a trainer needs to swap weights and free
memory (``/collective_rpc``, ``/sleep``, ``/wake_up``, ``/pause``, ``/reset_prefix_cache``) exist only with
``VLLM_SERVER_DEV_MODE=1``, unauthenticated: anything that reaches the port could call any worker method. So
hybridflow starts replicas *without* dev mode, with a random per-run key in ``VLLM_API_KEY`` (the environment:
a command-line flag would show in ``ps``), and this middleware

* refuses every request without ``Authorization: Bearer <key>`` (401), except read-only ``GET`` of
  ``/health``, ``/ping``, ``/version`` and ``/metrics`` (liveness and statistics);
* serves the few control calls the fleet needs, under ``/hybridflow/``, straight on the engine client:
  ``reload_weights`` (vLLM's ``reload_weights`` worker method with a safetensors folder, nothing else),
  ``reload_checked`` / ``check_folder`` (the same folder verified first against the trainer's per-tensor
  digests by :mod:`hybridflow.rollout.vllm.weight_check`'s worker extension; answer ``{"mismatch": [names]}``),
  ``reset_prefix_cache``, ``sleep?level=N``, ``wake_up``, ``pause?mode=abort|wait|keep`` and ``resume``;
  ``pause?...&hold=1`` marks the pause as a weight-sync hold until ``resume``, and ``held`` answers whether one is
  on (a client whose request came back aborted during a hold continues it after the resume: partial rollout).

A user who wants vLLM's dev endpoints sets ``VLLM_SERVER_DEV_MODE=1`` themselves; they then need the key too.
"""

from __future__ import annotations

import hmac
import json
import os

KEY_ENV = "VLLM_API_KEY"
OPEN_GETS = ("/health", "/ping", "/version", "/metrics")
PAUSE_MODES = ("abort", "wait", "keep")


async def _json_response(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


async def _read_body(receive, limit: int = 1 << 20) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            raise ValueError(f"request body over {limit} bytes")
        if not message.get("more_body"):
            return b"".join(chunks)


class HybridflowGuard:
    """Key check on every path, and the fleet's control endpoints (see the module docstring)."""

    def __init__(self, app):
        self.app = app
        key = os.environ.get(KEY_ENV, "")
        if not key:
            raise RuntimeError(f"hybridflow's vLLM guard needs the key in ${KEY_ENV}")
        self.key = key.encode()
        self.held = False  # a weight-sync hold (pause ... hold=1) until the next resume

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers") or []:
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if scope["type"] == "http" and scope.get("method") == "GET" and path in OPEN_GETS:
            return await self.app(scope, receive, send)
        if not self._authorized(scope):
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            return await _json_response(send, 401, {"error": "Unauthorized: this vLLM replica was started by "
                                                             "hybridflow and needs its per-run key"})
        if path.startswith("/hybridflow/"):
            return await self._control(scope, receive, send, path[len("/hybridflow/"):])
        return await self.app(scope, receive, send)

    async def _control(self, scope, receive, send, action: str) -> None:
        if scope.get("method") != "POST":
            return await _json_response(send, 405, {"error": "use POST"})
        engine = scope["app"].state.engine_client
        query = dict(part.split("=", 1) for part in scope.get("query_string", b"").decode().split("&") if "=" in part)
        try:
            body = await _read_body(receive)
            payload = json.loads(body) if body.strip() else {}
            if action in _WEIGHT_ACTIONS:
                status, reply = await _weights_call(engine, action, payload)
            else:
                status, reply = await self._lifecycle_call(engine, action, query)
        except (ValueError, TypeError) as e:
            return await _json_response(send, 400, {"error": f"{type(e).__name__}: {e}"})
        except Exception as e:  # noqa: BLE001 - the fleet reports it with the replica's name
            return await _json_response(send, 500, {"error": f"{action} failed: {type(e).__name__}: {e}"})
        return await _json_response(send, status, reply)

    async def _lifecycle_call(self, engine, action: str, query: dict[str, str]) -> tuple[int, dict]:
        """``reset_prefix_cache``, ``sleep``, ``wake_up``, ``pause``, ``resume``, ``held``: (status, reply)."""
        if action == "reset_prefix_cache":
            await engine.reset_prefix_cache()
        elif action == "sleep":
            level = int(query.get("level", "1"))
            if level not in (0, 1, 2):
                return 400, {"error": "level must be 0, 1 or 2"}
            await engine.sleep(level)
        elif action == "wake_up":
            await engine.wake_up(None)
        elif action == "pause":
            mode = query.get("mode", "abort")
            if mode not in PAUSE_MODES:
                return 400, {"error": f"mode must be one of {PAUSE_MODES}"}
            if query.get("hold") == "1":
                self.held = True  # before the abort: an aborted request must see the hold
            await engine.pause_generation(mode=mode)
        elif action == "resume":
            await engine.resume_generation()
            self.held = False
        elif action == "held":
            return 200, {"status": "ok", "action": action, "held": self.held}
        else:
            return 404, {"error": f"unknown control call {action!r}"}
        return 200, {"status": "ok", "action": action}


_WEIGHT_ACTIONS = ("reload_weights", "reload_checked", "check_folder")


async def _weights_call(engine, action: str, payload: dict) -> tuple[int, dict]:
    """``reload_weights`` (a safetensors folder), ``reload_checked`` / ``check_folder`` (the folder verified
    against the trainer's digests first; the reply names the tensors that did not match): (status, reply)."""
    if action == "reload_weights":
        path = payload.get("weights_path")
        if not isinstance(path, str) or not os.path.isdir(path):
            return 400, {"error": "weights_path must be an existing folder"}
        await engine.collective_rpc("reload_weights", kwargs={"weights_path": path, "is_checkpoint_format": True})
        return 200, {"status": "ok", "action": action}
    key = "weights_path" if action == "reload_checked" else "folder"
    path, sums = payload.get(key), payload.get("checksums")
    if not isinstance(path, str) or not os.path.isdir(path) or not isinstance(sums, str):
        return 400, {"error": f"{key} must be an existing folder and checksums a JSON string"}
    results = await engine.collective_rpc(action, kwargs={key: path, "checksums": sums})
    bad = sorted({n for r in (results or []) if isinstance(r, dict) for n in r.get("mismatch", [])})
    return 200, {"status": "ok", "action": action, "mismatch": bad}


__all__ = ["HybridflowGuard", "KEY_ENV", "OPEN_GETS"]
