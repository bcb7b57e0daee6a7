#!/usr/bin/env bash
# PPO with a critic (GAE advantages, Schulman et al. 2016) on the tiny addition task.
source "$(dirname "$0")/_tiny_setup.sh"
"$PYTHON" -m hybridflow.trainer.main_ppo "${COMMON[@]}" \
  algorithm.adv_estimator=gae algorithm.gamma=1.0 algorithm.lam=0.95 \
  critic.model.path="$MODEL_PATH" critic.optim.lr=1e-4 critic.ppo_micro_batch_size_per_gpu=16 \
  critic.forward_micro_batch_size_per_gpu=64 trainer.critic_warmup=0 \
  actor_rollout_ref.actor.use_kl_loss=false algorithm.use_kl_in_reward=true algorithm.kl_ctrl.kl_coef=0.001 \
  trainer.experiment_name=tiny_ppo_gae "$@"
