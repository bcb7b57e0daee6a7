#!/usr/bin/env bash
# REINFORCE++ (Hu 2025): token-level KL-shaped returns, batch-whitened advantages.
source "$(dirname "$0")/_tiny_setup.sh"
"$PYTHON" -m hybridflow.trainer.main_ppo "${COMMON[@]}" \
  algorithm.adv_estimator=reinforce_plus_plus algorithm.use_kl_in_reward=false \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=mse trainer.experiment_name=tiny_reinforce_plus_plus "$@"
