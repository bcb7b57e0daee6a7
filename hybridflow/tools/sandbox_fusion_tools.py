"""``code_interpreter``: the model runs Python and reads the output (verl's ``SandboxFusionTool``).

Without ``sandbox_fusion_url`` the code runs in :mod:`hybridflow.tools.sandbox` on this machine, so a laptop
run needs no service; with it, the code is sent to a SandboxFusion service (verl's remote sandbox, or
``hybridflow sandbox serve`` on another process/machine). Output returned to the model is stdout, then stderr
(so tracebacks teach it), then a one-line status when the run timed out or ran out of memory, truncated to
``max_output_chars``. Concurrency across trajectories is bounded by ``num_workers`` runs at a time, and with a
service also by ``rate_limit`` requests in flight (verl's meaning of the key).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from hybridflow.tools.base_tool import BaseTool, ExecuteResult, error_result, parse_tool_config, register_tool
from hybridflow.sandbox import SandboxConfig, SandboxResult, resolve_isolation, run_python
from hybridflow.sandbox.fusion_client import run_code_remote, run_code_url
from hybridflow.tools.schemas import ToolResponse


@dataclass
class CodeInterpreterConfig:
    """verl's keys: ``default_timeout`` (s), ``memory_limit_mb``, ``num_workers``, ``default_language``,
    ``sandbox_fusion_url`` (run remotely), ``rate_limit`` (requests in flight to the service) and
    ``enable_global_rate_limit`` (verl shares the limit across processes through a Ray actor; here it is per
    tool object, so only ``false`` or unset is accepted).
    """

    default_timeout: float = 10.0
    memory_limit_mb: int = 512
    num_workers: int = 4
    default_language: str = "python"
    max_output_chars: int = 4096
    max_code_chars: int = 65536
    isolation: str = "auto"
    sandbox_fusion_url: str | None = None
    rate_limit: int | None = None
    enable_global_rate_limit: bool | None = None


def format_result(result: SandboxResult, max_chars: int) -> str:
    """What the model reads: output, errors and the reason a run was stopped, within ``max_chars``."""
    parts = [result.stdout]
    if result.stderr:
        parts.append(result.stderr)
    if result.status == "timeout":
        parts.append("[execution stopped: time limit exceeded]")
    elif result.status == "memory":
        parts.append("[execution stopped: memory limit exceeded]")
    elif result.status == "fail" and not result.stderr:
        parts.append(f"[exit code {result.returncode}]")
    elif result.status == "error":
        parts.append("[sandbox error: the code could not be run]")
    text = "\n".join(p.rstrip("\n") for p in parts if p).strip("\n")
    if len(text) > max_chars:
        half = max_chars // 2
        text = f"{text[:half]}\n...[truncated {len(text) - 2 * half} chars]...\n{text[-half:]}"
    return text or "(no output)"


@register_tool("code_interpreter")
class SandboxFusionTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "Execute Python code in a sandbox and return its standard output and errors. "
                           "Use print() to see values.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The Python code to execute."}},
                "required": ["code"],
            },
        },
    }

    def __init__(self, config: dict | None = None, tool_schema=None):
        super().__init__(config, tool_schema)
        self.settings = parse_tool_config(CodeInterpreterConfig, self.config, self.name)
        s = self.settings
        if s.default_language != "python":
            raise ValueError(f"tool '{self.name}': default_language={s.default_language!r} is not supported; "
                             "the local sandbox runs 'python' only")
        if s.num_workers < 1:
            raise ValueError(f"tool '{self.name}': num_workers={s.num_workers} must be >= 1")
        if s.sandbox_fusion_url:
            run_code_url(s.sandbox_fusion_url)  # validates the URL now, not at the first call
        elif s.rate_limit is not None:
            raise ValueError(f"tool '{self.name}': rate_limit limits requests to a sandbox service; it needs "
                             "sandbox_fusion_url (the local sandbox is bounded by num_workers)")
        if s.rate_limit is not None and s.rate_limit < 1:
            raise ValueError(f"tool '{self.name}': rate_limit={s.rate_limit} must be >= 1")
        if s.enable_global_rate_limit:
            raise ValueError(f"tool '{self.name}': enable_global_rate_limit=true (one limit shared by every process "
                             "through a Ray actor) is not implemented; set it to false: rate_limit then bounds "
                             "the requests of each process")
        self.sandbox_config = SandboxConfig(timeout_s=s.default_timeout, memory_mb=s.memory_limit_mb,
                                            isolation=s.isolation)
        if not s.sandbox_fusion_url:
            resolve_isolation(self.sandbox_config)  # says which isolation runs the code; refuses when none works
        self._slots = threading.BoundedSemaphore(min(s.num_workers, s.rate_limit or s.num_workers))

    def _run(self, code: str) -> SandboxResult:
        s = self.settings
        with self._slots:
            if s.sandbox_fusion_url:
                return run_code_remote(s.sandbox_fusion_url, code, timeout_s=s.default_timeout,
                                       memory_mb=s.memory_limit_mb, language=s.default_language)
            return run_python(code, config=self.sandbox_config)

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> ExecuteResult:
        args, bad = self.check_arguments(parameters)
        if bad is not None:
            return bad
        code = args["code"]
        if len(code) > self.settings.max_code_chars:
            return error_result(f"{self.name}: code longer than {self.settings.max_code_chars} characters")
        result = await asyncio.to_thread(self._run, code)
        metrics = {"wall_s": result.wall_s, "passed": float(result.status == "pass")}
        return ToolResponse(text=format_result(result, self.settings.max_output_chars)), 0.0, metrics


CodeInterpreterTool = SandboxFusionTool  # hybridflow's earlier name

__all__ = ["SandboxFusionTool", "CodeInterpreterTool", "CodeInterpreterConfig", "format_result"]
