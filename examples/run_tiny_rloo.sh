#!/usr/bin/env bash
# RLOO (Ahmadian et al. 2024): leave-one-out baseline within each group; KL in the reward.
source "$(dirname "$0")/_tiny_setup.sh"
"$PYTHON" -m hybridflow.trainer.main_ppo "${COMMON[@]}" \
  algorithm.adv_estimator=rloo algorithm.use_kl_in_reward=true algorithm.kl_penalty=kl \
  algorithm.kl_ctrl.type=fixed algorithm.kl_ctrl.kl_coef=0.001 actor_rollout_ref.actor.use_kl_loss=false \
  trainer.experiment_name=tiny_rloo "$@"
