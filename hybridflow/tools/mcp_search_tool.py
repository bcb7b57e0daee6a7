"""``MCPSearchTool``: an MCP search server's tool (e.g. Tavily) with its JSON answer turned into a result list.

Search servers answer with JSON text such as ``{"query": ..., "results": [{"title", "url", "content"}, ...]}``.
The observation lists the results (title, then content); metrics count the queries and results. Text parts
that are not such JSON are passed through unchanged.
"""

from __future__ import annotations

import json

from hybridflow.tools.mcp_base_tool import MCPBaseTool


def _format_result(result: dict) -> str:
    title = str(result.get("title") or "").strip()
    body = str(result.get("content") or result.get("snippet") or "").strip()
    return f"{title}\n{body}".strip() if title else body


class MCPSearchTool(MCPBaseTool):
    def _parse_tool_result(self, content: list) -> tuple[str, dict]:
        blocks, queries, total = [], 0, 0
        for part in content:
            if getattr(part, "type", None) != "text":
                continue
            try:
                data = json.loads(part.text)
            except (json.JSONDecodeError, TypeError):
                data = None
            if not isinstance(data, dict) or not isinstance(data.get("results"), list):
                blocks.append(part.text)
                continue
            queries += 1
            results = [r for r in data["results"] if isinstance(r, dict)]
            total += len(results)
            blocks.extend(_format_result(r) for r in results)
        return "\n\n".join(b for b in blocks if b), {"query_count": float(queries), "total_results": float(total)}


__all__ = ["MCPSearchTool"]
