"""Rollout: inference engines behind one async token-in/token-out interface, and the batch front-end.

``create_rollout_engine("hf", model=..., tokenizer=...)`` builds an engine; ``generate_sequences`` turns a
prompt ``DataProto`` into the verl rollout layout (``prompts``, ``responses``, ``response_mask``, ...).
"""

from hybridflow.rollout.base import ROLLOUT_ENGINES, RolloutEngine, TokenOutput, create_rollout_engine
from hybridflow.rollout.batch import generate_sequences
from hybridflow.rollout.sampling_params import SamplingParams

__all__ = [
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "SamplingParams",
    "TokenOutput",
    "create_rollout_engine",
    "generate_sequences",
]
