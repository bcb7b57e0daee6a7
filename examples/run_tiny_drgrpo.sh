#!/usr/bin/env bash
# Dr. GRPO (Liu et al. 2025): no std normalisation, length-unbiased seq-mean-token-sum-norm aggregation.
source "$(dirname "$0")/_tiny_setup.sh"
"$PYTHON" -m hybridflow.trainer.main_ppo "${COMMON[@]}" \
  algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=false \
  actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm actor_rollout_ref.actor.use_kl_loss=false \
  trainer.experiment_name=tiny_drgrpo "$@"
