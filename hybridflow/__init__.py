"""hybridflow: HybridFlow-style RL post-training for LLMs.

One Python controller writes the RL dataflow; each model role runs as an SPMD worker group
(FSDP2 training, an inference engine for generation) on Ray -- or all in one process for debugging.
"""

__version__ = "0.1.0"


def _strict_matmul_default() -> None:
    # MKL's strict reproducibility mode (engine/batch_invariant.py): every row of an fp32 CPU matrix product the same
    # bits whatever the product's shape and thread count -- what exact on-policy log-probs stand on. MKL reads it at
    # its first call, so it is set here, before any; child processes (Ray workers, ranks) inherit it.
    import os

    if os.environ.get("HYBRIDFLOW_STRICT_MATMUL", "1") != "0":
        os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")


_strict_matmul_default()

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
