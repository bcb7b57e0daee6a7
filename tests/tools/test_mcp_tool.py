"""MCP tools (config.type: mcp) against a real MCP server started by the test (stdio), and the missing-extra error."""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import sys
import textwrap

import pytest

from hybridflow.tools import ToolExecutor, initialize_tools_from_config

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mcp_calc_server.py")


def write_configs(tmp_path, class_name="verl.tools.mcp_base_tool.MCPBaseTool", selected=None, extra=""):
    servers = {"mcpServers": {"calc": {"command": sys.executable, "args": [SERVER],
                                       "env": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}}}}
    (tmp_path / "mcp_servers.json").write_text(json.dumps(servers))
    selected_yaml = f"\n      tool_selected_list: {json.dumps(selected)}" if selected is not None else ""
    (tmp_path / "tools.yaml").write_text(textwrap.dedent(f"""
        tools:
          - class_name: {class_name}
            config: {{type: mcp, timeout: 2, rate_limit: 50{extra}}}
            mcp:
              mcp_servers_config_path: mcp_servers.json""") + selected_yaml + "\n")
    return tmp_path / "tools.yaml"


@pytest.fixture(autouse=True)
def _close_servers():
    yield
    if "mcp" in sys.modules:
        from hybridflow.tools.utils.mcp_client import close_all_managers

        close_all_managers()


def test_mcp_tools_are_listed_and_called(tmp_path):
    pytest.importorskip("mcp", reason="needs the 'mcp' extra (pip install 'hybridflow[mcp]')")
    from hybridflow.tools.mcp_base_tool import MCPBaseTool

    tools = initialize_tools_from_config(write_configs(tmp_path))
    assert [t.name for t in tools] == ["add", "search_docs", "fail", "slow"]
    assert all(isinstance(t, MCPBaseTool) for t in tools)
    add = tools[0].get_openai_tool_schema().model_dump(exclude_none=True)["function"]
    assert add["description"] == "Add two integers."
    assert add["parameters"]["required"] == ["a", "b"]
    assert add["parameters"]["properties"]["a"]["type"] == "integer"

    ex = ToolExecutor(tools, timeout_s=20)

    async def go():  # the sessions live on their own loop: calls work from this (another) event loop
        return await asyncio.gather(ex.call("add", '{"a": 2, "b": 40}'), ex.call("add", {"a": "x", "b": 1}),
                                    ex.call("fail", {"message": "bad input"}), ex.call("slow", {"seconds": 30}))

    added, wrong_type, failed, slow = asyncio.run(go())
    assert added.ok and added.text == "42"
    assert wrong_type.error_kind == "invalid_arguments"  # our schema check, before the server is asked
    assert failed.ok and failed.text.startswith("Error: ") and "bad input" in failed.text
    assert failed.metrics == {"error": 1.0}
    assert slow.error_kind == "tool_exception" and "did not answer within 2 s (config.timeout)" in slow.text


def test_tool_selected_list_and_search_parsing(tmp_path):
    pytest.importorskip("mcp", reason="needs the 'mcp' extra (pip install 'hybridflow[mcp]')")
    path = write_configs(tmp_path, "verl.tools.mcp_search_tool.MCPSearchTool", selected=["search_docs"])
    (search,) = initialize_tools_from_config(path)
    out = asyncio.run(ToolExecutor([search]).call("search_docs", {"query": "ray"}))
    assert out.text == "About ray\nray is documented.\n\nOther\nunrelated"
    assert out.metrics == {"query_count": 1.0, "total_results": 2.0}
    with pytest.raises(ValueError, match=r"tool_selected_list names \['nope'\]"):
        initialize_tools_from_config(write_configs(tmp_path, selected=["nope"]))


def test_mcp_config_errors(tmp_path):
    pytest.importorskip("mcp", reason="needs the 'mcp' extra (pip install 'hybridflow[mcp]')")
    with pytest.raises(TypeError, match="needs an MCPBaseTool subclass"):
        initialize_tools_from_config(write_configs(tmp_path, "calculator"))
    with pytest.raises(ValueError, match="did you mean 'timeout'"):
        initialize_tools_from_config(write_configs(tmp_path, extra=", timout: 3"))
    (tmp_path / "mcp_servers.json").write_text('{"mcpServers": {"x": {"command": "/nonexistent/server"}}}')
    (tmp_path / "t.yaml").write_text("tools:\n  - class_name: verl.tools.mcp_base_tool.MCPBaseTool\n"
                                     "    config: {type: mcp}\n    mcp: {mcp_servers_config_path: mcp_servers.json}\n")
    with pytest.raises(RuntimeError, match="MCP server 'x' .* could not be started"):
        initialize_tools_from_config(tmp_path / "t.yaml")
    (tmp_path / "mcp_servers.json").write_text('{"mcpServers": {"x": {"url": "http://h/mcp", "command": "y"}}}')
    with pytest.raises(ValueError, match="exactly one of 'command'"):
        initialize_tools_from_config(tmp_path / "t.yaml")
    (tmp_path / "u.yaml").write_text("tools:\n  - class_name: verl.tools.mcp_base_tool.MCPBaseTool\n"
                                     "    config: {type: mcp}\n")
    with pytest.raises(ValueError, match="needs 'mcp: {mcp_servers_config_path"):
        initialize_tools_from_config(tmp_path / "u.yaml")


def test_missing_mcp_package_names_the_extra(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_mcp(name, *args, **kwargs):
        if name == "mcp" or name.startswith("mcp."):
            raise ImportError("No module named 'mcp'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mcp)
    with pytest.raises(ImportError, match=r"pip install 'hybridflow\[mcp\]'") as info:
        initialize_tools_from_config(write_configs(tmp_path))
    assert "tools[0]: config.type=mcp" in str(info.value)


def test_streamable_http_server(tmp_path):
    pytest.importorskip("mcp", reason="needs the 'mcp' extra (pip install 'hybridflow[mcp]')")
    import socket
    import subprocess
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen([sys.executable, SERVER, "streamable-http", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        servers = {"mcpServers": {"remote": {"url": f"http://127.0.0.1:{port}/mcp", "auth_token": "t0ken"}}}
        (tmp_path / "mcp_servers.json").write_text(json.dumps(servers))
        (tmp_path / "tools.yaml").write_text("tools:\n  - class_name: verl.tools.mcp_base_tool.MCPBaseTool\n"
                                             "    config: {type: mcp}\n    mcp: {mcp_servers_config_path: "
                                             f"{tmp_path / 'mcp_servers.json'}, tool_selected_list: [add]}}\n")
        (add,) = initialize_tools_from_config(tmp_path / "tools.yaml")
        assert asyncio.run(ToolExecutor([add]).call("add", {"a": 20, "b": 22})).text == "42"
    finally:
        from hybridflow.tools.utils.mcp_client import close_all_managers

        close_all_managers()
        proc.terminate()
        proc.wait(timeout=10)
