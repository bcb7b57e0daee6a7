"""A small real MCP server for the MCP tool tests: ``python mcp_calc_server.py [stdio|streamable-http PORT]``.

Tools: ``add(a, b)``, ``search_docs(query)`` (answers Tavily-style JSON), ``fail(message)`` (a tool-level
error) and ``slow(seconds)``. Built with the ``mcp`` SDK (2.x ``MCPServer``; 1.x ``FastMCP``).
"""

import json
import sys
import time

try:
    from mcp.server.mcpserver import MCPServer as Server  # mcp 2.x
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server  # mcp 1.x
    from mcp.server.fastmcp.exceptions import ToolError

transport = sys.argv[1] if len(sys.argv) > 1 else "stdio"
port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
server = Server("calc")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def search_docs(query: str) -> str:
    """Search the documents."""
    results = [{"title": f"About {query}", "url": "http://docs.invalid/1", "content": f"{query} is documented."},
               {"title": "Other", "url": "http://docs.invalid/2", "content": "unrelated"}]
    return json.dumps({"query": query, "results": results})


@server.tool()
def fail(message: str) -> str:
    """Always fails."""
    raise ToolError(message)


@server.tool()
def slow(seconds: float) -> str:
    """Sleeps."""
    time.sleep(seconds)
    return "done"


if __name__ == "__main__":
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)
