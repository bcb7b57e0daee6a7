"""Old import path of the SandboxFusion client: now :mod:`hybridflow.sandbox.fusion_client`."""

from hybridflow.sandbox.fusion_client import (  # noqa: F401
    ConcurrencyLimit,
    SandboxFusionError,
    run_code_remote,
    run_code_url,
)

__all__ = ["ConcurrencyLimit", "SandboxFusionError", "run_code_remote", "run_code_url"]
