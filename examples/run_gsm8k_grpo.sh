#!/usr/bin/env bash
# GRPO on GSM8K, as verl's examples/grpo_trainer/run_qwen2-7b.sh but sized for one GPU (or a patient CPU).
# MODEL_PATH: any HF causal LM with a chat template (e.g. Qwen2.5-0.5B-Instruct downloaded beforehand).
# GSM8K_INPUT: folder with train.jsonl/test.jsonl (default: the copy beside this repo); unset = the hub.
set -euo pipefail
PYTHON=${PYTHON:-python}
MODEL_PATH=${MODEL_PATH:?set MODEL_PATH to a local HF model folder}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
GSM8K_INPUT=${GSM8K_INPUT:-$(cd "$(dirname "$0")/../.." && pwd)/shared/data/gsm8k}
if [ ! -f "$DATA_DIR/train.parquet" ]; then
  "$PYTHON" -c "import sys; from hybridflow.data.preprocess.gsm8k import main; main(sys.argv[1:])" --input "$GSM8K_INPUT" --local-dir "$DATA_DIR"
fi
"$PYTHON" -m hybridflow.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$DATA_DIR/train.parquet" data.val_files="$DATA_DIR/test.parquet" \
  data.train_batch_size=${TRAIN_BATCH_SIZE:-64} data.max_prompt_length=512 data.max_response_length=512 \
  data.filter_overlong_prompts=true data.truncation=error \
  actor_rollout_ref.model.path="$MODEL_PATH" actor_rollout_ref.model.use_remove_padding=true \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.n=5 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  algorithm.use_kl_in_reward=false \
  trainer.backend=${BACKEND:-ray} trainer.device=${DEVICE:-auto} trainer.n_gpus_per_node=${NGPUS:-1} trainer.nnodes=1 \
  trainer.logger=[console,file] trainer.project_name=hybridflow_examples trainer.experiment_name=gsm8k_grpo \
  trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15 "$@"
