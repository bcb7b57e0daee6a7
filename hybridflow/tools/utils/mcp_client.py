"""Connections to MCP servers (Model Context Protocol) for ``type: mcp`` tools; needs ``pip install hybridflow[mcp]``.

The servers file is the usual MCP client format (the one verl's ``mcp_servers_config_path`` points at)::

    {"mcpServers": {
        "calc":   {"command": "python", "args": ["my_server.py"], "env": {"K": "V"}, "cwd": "/path"},
        "remote": {"url": "http://127.0.0.1:8000/mcp", "auth_token": "...", "headers": {...}}}}

``command`` servers are started as subprocesses and spoken to over stdio; ``url`` servers over streamable
HTTP (over SSE when the URL ends with ``/sse`` or ``"transport": "sse"`` is given). ``auth_token`` becomes an
``Authorization: Bearer`` header.

One :class:`MCPClientManager` per servers file (shared by every tool read from it) keeps one session per
server open for the life of the process. The sessions live on a background event loop thread, so tools can
call them from any event loop (agent-loop workers run their own) and from synchronous start-up code.
``rate_limit`` (calls per second, all servers of the file together) is applied with a token bucket.
Works with the ``mcp`` SDK 1.x and 2.x.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

MCP_EXTRA_HINT = "MCP tools need the 'mcp' package: pip install 'hybridflow[mcp]'"


def require_mcp():
    """Import the ``mcp`` SDK or fail with the extra to install."""
    try:
        import mcp  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{MCP_EXTRA_HINT} ({e})") from e
    return mcp


@dataclass
class MCPServerSpec:
    name: str
    command: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    transport: str = "stdio"


_SERVER_KEYS = {"command", "args", "env", "cwd", "url", "auth_token", "headers", "transport", "type"}


def load_mcp_servers(path: str) -> list[MCPServerSpec]:
    """Parse an ``{"mcpServers": {...}}`` file; errors name the file, the server and the fix."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"mcp_servers_config_path {path!r} does not exist (tool config 'mcp:' section)")
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict) or not servers:
        raise ValueError(f'{path}: expected {{"mcpServers": {{"<name>": {{"command": ...}} or {{"url": ...}}}}}}')
    specs = []
    for name, entry in servers.items():
        where = f"{path}: mcpServers.{name}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be an object")
        unknown = sorted(set(entry) - _SERVER_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(_SERVER_KEYS)}")
        if bool(entry.get("command")) == bool(entry.get("url")):
            raise ValueError(f"{where} needs exactly one of 'command' (a local server over stdio) or 'url'")
        headers = {str(k): str(v) for k, v in (entry.get("headers") or {}).items()}
        if entry.get("auth_token"):
            headers["Authorization"] = f"Bearer {entry['auth_token']}"
        if entry.get("command"):
            transport = "stdio"
        else:
            url = str(entry["url"])
            transport = entry.get("transport") or entry.get("type") or ("sse" if url.rstrip("/").endswith("/sse")
                                                                         else "streamable_http")
            transport = str(transport).replace("-", "_")
            if transport == "http":
                transport = "streamable_http"
            if transport not in ("sse", "streamable_http"):
                raise ValueError(f"{where}: transport {transport!r} must be 'streamable_http' or 'sse'")
        specs.append(MCPServerSpec(name=name, command=entry.get("command"), args=[str(a) for a in entry.get("args", [])],
                                   env={str(k): str(v) for k, v in entry["env"].items()} if entry.get("env") else None,
                                   cwd=entry.get("cwd"), url=entry.get("url"), headers=headers, transport=transport))
    return specs


class TokenBucket:
    """At most ``rate`` acquisitions per second on average (bursts up to ``rate``)."""

    def __init__(self, rate: float):
        if not rate > 0:
            raise ValueError(f"MCP rate_limit must be > 0 calls per second, got {rate}")
        self.rate = float(rate)
        self.tokens = float(rate)
        self.stamp = time.monotonic()

    async def acquire(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.rate)


@contextlib.asynccontextmanager
async def _transport(spec: MCPServerSpec):
    """(read, write) streams to one server, for SDK 1.x and 2.x."""
    if spec.transport == "stdio":
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=spec.command, args=spec.args, env=spec.env, cwd=spec.cwd)
        async with stdio_client(params) as streams:
            yield streams[0], streams[1]
    elif spec.transport == "sse":
        from mcp.client.sse import sse_client

        async with sse_client(spec.url, headers=spec.headers or None) as streams:
            yield streams[0], streams[1]
    else:
        import mcp.client.streamable_http as http

        if hasattr(http, "streamable_http_client"):  # SDK 2.x
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = create_mcp_http_client(headers=spec.headers) if spec.headers else None
            context = http.streamable_http_client(spec.url, http_client=client)
        else:  # SDK 1.x
            context = http.streamablehttp_client(spec.url, headers=spec.headers or None)
        async with context as streams:
            yield streams[0], streams[1]


def _field(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)
    return default


def mcp_tool_to_openai(tool: Any) -> dict:
    """An MCP ``Tool`` -> ``{type: function, function: {name, description, parameters}}``."""
    parameters = dict(_field(tool, "input_schema", "inputSchema", default=None) or {"type": "object"})
    parameters.setdefault("properties", {})
    parameters["required"] = list(parameters.get("required") or [])
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": parameters, "strict": False}}


class MCPClientManager:
    """Open sessions to the servers of one servers file; see the module doc."""

    def __init__(self, servers: list[MCPServerSpec], rate_limit: float | None = None, start_timeout_s: float = 60.0):
        require_mcp()
        self.servers = servers
        self.start_timeout_s = start_timeout_s
        self.bucket = TokenBucket(rate_limit) if rate_limit else None
        self.sessions: dict[str, Any] = {}
        self.tool_server: dict[str, str] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hybridflow-mcp", daemon=True)
        self._thread.start()
        self._stop: asyncio.Event | None = None
        self._holders: list[Any] = []
        self._closed = False
        try:
            self._run(self._start(), start_timeout_s)
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)

    def _run(self, coro, timeout: float | None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> None:
        self._stop = asyncio.Event()
        for spec in self.servers:
            ready = asyncio.get_running_loop().create_future()
            self._holders.append(asyncio.ensure_future(self._hold(spec, ready)))
            try:
                await asyncio.wait_for(asyncio.shield(ready), self.start_timeout_s)
            except asyncio.TimeoutError:
                raise TimeoutError(f"MCP server {spec.name!r} did not finish its handshake within "
                                   f"{self.start_timeout_s:g} s") from None

    async def _hold(self, spec: MCPServerSpec, ready: asyncio.Future) -> None:
        """Keep one session open until :meth:`close` (context managers enter and exit in this task)."""
        from mcp import ClientSession

        try:
            async with _transport(spec) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                self.sessions[spec.name] = session
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as e:
            if not ready.done():
                what = f"'{spec.command} {' '.join(spec.args)}'" if spec.command else spec.url
                ready.set_exception(RuntimeError(f"MCP server {spec.name!r} ({what}) could not be started or "
                                                 f"reached: {type(e).__name__}: {e}"))
            elif not isinstance(e, asyncio.CancelledError):
                raise

    def list_tools(self, selected: list[str] | None = None) -> list[dict]:
        """OpenAI schemas of the servers' tools (only ``selected`` names when given, in server order)."""

        async def fetch():
            schemas = []
            for spec in self.servers:
                result = await self.sessions[spec.name].list_tools()
                for tool in result.tools:
                    if selected and tool.name not in selected:
                        continue
                    self.tool_server[tool.name] = spec.name
                    schemas.append(mcp_tool_to_openai(tool))
            return schemas

        schemas = self._run(fetch(), self.start_timeout_s)
        missing = sorted(set(selected or []) - {s["function"]["name"] for s in schemas})
        if missing:
            raise ValueError(f"tool_selected_list names {missing}, which no MCP server offers; offered: "
                             f"{sorted(self.tool_server)}")
        return schemas

    async def call_tool(self, name: str, arguments: dict, timeout_s: float) -> Any:
        """``CallToolResult`` of ``name(arguments)``; awaitable from any event loop."""
        if name not in self.tool_server:
            raise KeyError(f"no MCP server offers tool {name!r}")

        async def call():
            if self.bucket is not None:
                await self.bucket.acquire()
            session = self.sessions[self.tool_server[name]]
            return await asyncio.wait_for(session.call_tool(name, arguments), timeout_s)

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), self._loop))

    def close(self) -> None:
        """Close the sessions (stdio servers exit) and stop the background loop."""
        if self._closed:
            return
        self._closed = True

        async def stop():
            if self._stop is not None:
                self._stop.set()
            if self._holders:
                await asyncio.wait(self._holders, timeout=10)

        with contextlib.suppress(Exception):
            self._run(stop(), 15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


_MANAGERS: dict[str, MCPClientManager] = {}
_MANAGERS_LOCK = threading.Lock()


def get_client_manager(servers_path: str, rate_limit: float | None = None) -> MCPClientManager:
    """The shared manager of a servers file (started on first use)."""
    key = os.path.realpath(servers_path)
    with _MANAGERS_LOCK:
        manager = _MANAGERS.get(key)
        if manager is None or manager._closed:
            manager = MCPClientManager(load_mcp_servers(servers_path), rate_limit=rate_limit)
            _MANAGERS[key] = manager
        return manager


def close_all_managers() -> None:
    with _MANAGERS_LOCK:
        for manager in _MANAGERS.values():
            manager.close()
        _MANAGERS.clear()


__all__ = ["MCPClientManager", "MCPServerSpec", "MCP_EXTRA_HINT", "TokenBucket", "close_all_managers",
           "get_client_manager", "load_mcp_servers", "mcp_tool_to_openai", "require_mcp"]
