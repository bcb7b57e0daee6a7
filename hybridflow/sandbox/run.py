"""``run_python``: run untrusted Python (model-written code) in the strongest sandbox this machine offers."""

from __future__ import annotations

import dataclasses

from hybridflow.sandbox.limits import SandboxConfig, SandboxResult
from hybridflow.sandbox.modes import resolve_isolation
from hybridflow.sandbox.runner import execute


def run_python(
    code: str,
    stdin: str = "",
    timeout_s: float | None = None,
    memory_mb: int | None = None,
    config: SandboxConfig | None = None,
    allow_forks: int = 0,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` under the limits of ``config`` (``timeout_s``/``memory_mb`` override it).

    Thread-safe: every call has its own temp dir, namespaces and process group. Never raises for anything the
    code does; raises ``TypeError``/``ValueError`` for invalid arguments and
    :class:`~hybridflow.sandbox.modes.SandboxUnavailable` when the requested isolation cannot work here.
    ``allow_forks`` matters only in ``audit`` mode, which refuses ``os.fork`` beyond that many calls (the
    code-reward harness forks once, before any untrusted code runs).
    """
    if not isinstance(code, str):
        raise TypeError(f"run_python(code=...) must be a str, got {type(code).__name__}")
    if not isinstance(stdin, str):
        raise TypeError(f"run_python(stdin=...) must be a str, got {type(stdin).__name__}")
    config = config or SandboxConfig()
    if timeout_s is not None or memory_mb is not None:
        config = dataclasses.replace(config, timeout_s=config.timeout_s if timeout_s is None else timeout_s,
                                     memory_mb=config.memory_mb if memory_mb is None else memory_mb)
    return execute(code, stdin, config, resolve_isolation(config), allow_forks)


__all__ = ["run_python"]
