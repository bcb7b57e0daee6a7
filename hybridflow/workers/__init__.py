"""Role workers (``Worker`` subclasses with ``@register`` methods): actor/rollout/ref, critic, reward model.

They are thin: model work goes to ``hybridflow.engine``, generation to ``hybridflow.rollout`` and the
loss maths to ``hybridflow.algorithms``.
"""

from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker
from hybridflow.workers.critic import CriticWorker
from hybridflow.workers.reward_model import RewardModelWorker

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker"]
