#!/usr/bin/env bash
# GSPO (Zheng et al. 2025): sequence-level importance ratio, very tight clip range (3e-4 / 4e-4).
source "$(dirname "$0")/_tiny_setup.sh"
"$PYTHON" -m hybridflow.trainer.main_ppo "${COMMON[@]}" \
  algorithm.adv_estimator=grpo actor_rollout_ref.actor.policy_loss.loss_mode=gspo \
  actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean \
  actor_rollout_ref.actor.clip_ratio_low=0.0003 actor_rollout_ref.actor.clip_ratio_high=0.0004 \
  actor_rollout_ref.actor.use_kl_loss=false trainer.experiment_name=tiny_gspo "$@"
