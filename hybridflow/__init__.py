"""hybridflow: HybridFlow-style RL post-training for LLMs.

One Python controller writes the RL dataflow; each model role runs as an SPMD worker group
(FSDP2 training, an inference engine for generation) on Ray -- or all in one process for debugging.
"""

__version__ = "0.1.0"

__all__ = ["DataProto", "__version__"]


def __getattr__(name):
    # Lazy so that light processes (reward scorers, the CLI's dry run) do not pay torch's import.
    if name == "DataProto":
        from hybridflow.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'hybridflow' has no attribute {name!r}")
