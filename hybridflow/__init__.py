"""hybridflow: HybridFlow-style RL post-training for LLMs.

One Python controller writes the RL dataflow; each model role runs as an SPMD worker group
(FSDP2 training, an inference engine for generation) on Ray -- or all in one process for debugging.
"""

import os as _os

__version__ = "0.1.0"

# Fork and gRPC: grpcio (imported by Ray) registers its C core's fork handlers by default. In a long-lived driver
# that had run many Ray sessions (the test suite's worker processes), the child forked to exec Ray's GCS died with
# SIGSEGV inside pthread_join before exec (kernel log: "python[pid]: segfault ... in libc.so.6"; hybridflow said
# "its GCS process ... exited with code -11"): a fork handler touching a thread of the parent. hybridflow's forked
# children exec at once or never use gRPC, so gRPC's fork handling is switched off unless the user chose otherwise.
# grpc reads the variable when it is first imported: set here, before Ray is.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__all__ = ["DataProto", "__version__"]


def __getattr__(name):
    # Lazy so that light processes (reward scorers, the CLI's dry run) do not pay torch's import.
    if name == "DataProto":
        from hybridflow.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'hybridflow' has no attribute {name!r}")


def _import_user_modules() -> None:
    # trainer.import_modules (written to HYBRIDFLOW_IMPORT_MODULES by the controller) and verl's
    # VERL_USE_EXTERNAL_MODULES: every process that imports hybridflow -- Ray workers, agent-loop workers,
    # scoring processes -- registers the user's extensions before it unpickles anything that names them.
    import os

    if os.environ.get("HYBRIDFLOW_IMPORT_MODULES") or os.environ.get("VERL_USE_EXTERNAL_MODULES"):
        from hybridflow.utils.user_modules import import_from_environment

        import_from_environment()


_import_user_modules()
