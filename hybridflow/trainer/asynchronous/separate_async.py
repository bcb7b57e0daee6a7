"""verl's V1 ``separate_async``: standalone rollout replicas generate without pause; the trainer takes one PPO
mini-batch at a time and pushes the weights after ``parameter_sync_step`` of them.

This is hybridflow's fully async controller (rollouter, standalone replicas, checkpoint-engine sync, partial
rollout) run by V1's rules (:mod:`~hybridflow.trainer.asynchronous.v1_async`): the trainer submits the prompts,
the replay buffer decides which groups are trained, and one step is ``parameter_sync_step`` mini-batches of
``data.train_batch_size / parameter_sync_step`` prompt groups, each trained as soon as it is available, then one
weight sync (a new weight version; in-flight requests are interrupted and continue on the new weights).

pi_old (verl's decoupled PPO): unless ``algorithm.rollout_correction.bypass_mode=true`` (pi_old = the rollout's
log-probs), every mini-batch of a version computes pi_old with the weights the version started from -- the
first mini-batch with the actor as it is, the later ones with a CPU copy of those weights swapped in for the
old-log-prob pass (``save_actor_weights`` / ``PI_OLD_WEIGHTS``), so the whole version shares one pi_old.
"""

from __future__ import annotations

from hybridflow.algorithms.batch_ops import PI_OLD_WEIGHTS
from hybridflow.trainer import stages
from hybridflow.trainer.asynchronous.v1_async import V1AsyncTrainer

__all__ = ["V1SeparateAsyncTrainer"]

_VERSION_WEIGHTS = "v1_version_start"


class V1SeparateAsyncTrainer(V1AsyncTrainer):
    """verl's ``separate_async`` (see the module docstring)."""

    mini_batch_index = 0

    def start_rollout(self, resumed: bool) -> None:
        stages.sync_rollout_weights(self.groups)  # the replicas start from the trainer's weights: this version
        super().start_rollout(resumed)

    @property
    def decoupled_pi_old(self) -> bool:
        """pi_old is recomputed (no bypass) by a separate pass, over more than one mini-batch per version."""
        plan = self.plan
        return self.sync_every > 1 and not (plan.reuse_rollout_log_probs or plan.old_log_prob_in_update)

    def train_on_batch(self, batch, timing, metrics):
        if self.decoupled_pi_old:
            actor = self.groups.actor_rollout
            if self.mini_batch_index == 0:
                actor.save_actor_weights(_VERSION_WEIGHTS)  # the version's weights, before its first update
            else:
                batch.meta_info[PI_OLD_WEIGHTS] = _VERSION_WEIGHTS
        batch = super().train_on_batch(batch, timing, metrics)
        if self.decoupled_pi_old and self.local_step == 0:  # the version ended (weights pushed)
            self.groups.actor_rollout.drop_actor_weights(_VERSION_WEIGHTS)
        return batch
