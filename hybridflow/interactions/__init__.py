"""Interactions: simulated users that answer the model between turns (verl's ``BaseInteraction`` API).

``rollout.multi_turn.interaction_config_path`` names a YAML list of interactions; each sample picks one with
``extra_info.interaction_kwargs.name``. See docs/agents.md.
"""

from hybridflow.interactions.base import BaseInteraction
from hybridflow.interactions.gsm8k_interaction import Gsm8kInteraction
from hybridflow.interactions.utils.interaction_registry import initialize_interactions_from_config

__all__ = ["BaseInteraction", "Gsm8kInteraction", "initialize_interactions_from_config"]
