#!/usr/bin/env bash
# DAPO (Yu et al. 2025): clip-higher, token-mean loss, overlong reward shaping, dynamic sampling.
source "$(dirname "$0")/_tiny_setup.sh"
"$PYTHON" -m hybridflow.trainer.main_ppo "${COMMON[@]}" \
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false actor_rollout_ref.actor.use_kl_loss=false \
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  reward_model.reward_manager=dapo +reward_model.reward_kwargs.max_resp_len=4 \
  +reward_model.reward_kwargs.overlong_buffer_cfg.enable=true +reward_model.reward_kwargs.overlong_buffer_cfg.len=1 \
  +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \
  algorithm.filter_groups.enable=true algorithm.filter_groups.metric=seq_reward \
  algorithm.filter_groups.max_num_gen_batches=10 data.gen_batch_size=24 \
  trainer.experiment_name=tiny_dapo "$@"
