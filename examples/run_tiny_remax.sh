#!/usr/bin/env bash
# ReMax (Li et al. 2024): the greedy response's reward is the baseline (an extra gen_max generation).
source "$(dirname "$0")/_tiny_setup.sh"
"$PYTHON" -m hybridflow.trainer.main_ppo "${COMMON[@]}" \
  algorithm.adv_estimator=remax algorithm.use_kl_in_reward=true algorithm.kl_penalty=kl \
  actor_rollout_ref.rollout.val_kwargs.do_sample=false actor_rollout_ref.actor.use_kl_loss=false \
  trainer.experiment_name=tiny_remax "$@"
