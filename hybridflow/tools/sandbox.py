"""Old import path of the code sandbox, kept working: the sandbox is :mod:`hybridflow.sandbox` now (a package
below the tools and rewards floors, so that neither imports the other through it)."""

from hybridflow.sandbox import (  # noqa: F401
    SandboxConfig,
    SandboxResult,
    SandboxUnavailable,
    available_isolations,
    namespaces_available,
    resolve_isolation,
    run_python,
)

__all__ = ["SandboxConfig", "SandboxResult", "SandboxUnavailable", "available_isolations", "namespaces_available",
           "resolve_isolation", "run_python"]
