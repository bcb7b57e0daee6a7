"""The code sandbox: run model-written Python confined by the OS (below the rewards and tools floors).

Code rewards and the ``code_interpreter`` tool execute whatever the policy writes, thousands of times per step
and in parallel; RL finds every hole. This package imports nothing else from hybridflow.

* :func:`run_python` / :class:`SandboxConfig` / :class:`SandboxResult`: one confined run;
* :mod:`~hybridflow.sandbox.modes`: which isolation this machine offers and which ``auto`` picks;
* :mod:`~hybridflow.sandbox.fusion_client`: the same runs on a SandboxFusion HTTP service;
* :mod:`~hybridflow.sandbox.http_service`: ``hybridflow sandbox serve``, that service on top of this sandbox.

What each mode guarantees and how it is tested: docs/sandbox.md.
"""

from hybridflow.sandbox.limits import ISOLATIONS, SandboxConfig, SandboxResult
from hybridflow.sandbox.modes import (
    SandboxUnavailable,
    available_isolations,
    namespaces_available,
    probe,
    resolve_isolation,
)
from hybridflow.sandbox.run import run_python

__all__ = [
    "ISOLATIONS",
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailable",
    "available_isolations",
    "namespaces_available",
    "probe",
    "resolve_isolation",
    "run_python",
]
