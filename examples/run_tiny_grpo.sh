#!/usr/bin/env bash
# GRPO (Shao et al. 2024): group-normalised outcome advantages, KL as a loss (low_var_kl / k3).
source "$(dirname "$0")/_tiny_setup.sh"
"$PYTHON" -m hybridflow.trainer.main_ppo "${COMMON[@]}" \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0 \
  trainer.experiment_name=tiny_grpo "$@"
