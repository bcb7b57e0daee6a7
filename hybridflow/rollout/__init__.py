"""Rollout: inference engines behind one async token-in/token-out interface, and the service around them.

``create_rollout_engine("hf", model=..., tokenizer=...)`` builds an engine; a ``RolloutServer`` serves it on
its own event loop; replicas (``rollout.replica``) reach servers in this process or in Ray actors; the
``AsyncLLMServerManager`` routes agent-loop requests over replicas; fleets (``rollout.fleet``) wake, put to
sleep and feed weights to the replicas.  Prompt batches become trajectories in :mod:`hybridflow.agents`.
"""

from hybridflow.rollout.base import ROLLOUT_ENGINES, RolloutEngine, TokenOutput, create_rollout_engine
from hybridflow.rollout.sampling_params import SamplingParams

__all__ = [
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "SamplingParams",
    "TokenOutput",
    "create_rollout_engine",
]
