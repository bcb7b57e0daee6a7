"""Old import path of ``hybridflow sandbox serve``: now :mod:`hybridflow.sandbox.http_service`."""

from hybridflow.sandbox.http_service import (  # noqa: F401
    MAX_BODY_BYTES,
    SandboxService,
    main,
    make_server,
    response_for,
    serve_in_thread,
    setup_parser,
)

__all__ = ["MAX_BODY_BYTES", "SandboxService", "main", "make_server", "response_for", "serve_in_thread",
           "setup_parser"]
