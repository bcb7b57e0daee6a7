"""hybridflow: HybridFlow-style RL post-training for LLMs.

One Python controller writes the RL dataflow; each model role runs as an SPMD worker group
(FSDP2 training, an inference engine for generation) on Ray -- or all in one process for debugging.
"""

__version__ = "0.1.0"

from hybridflow.protocol import DataProto  # noqa: E402

__all__ = ["DataProto", "__version__"]
