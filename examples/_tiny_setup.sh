#!/usr/bin/env bash
# Shared set-up of the tiny examples: a ~0.4M-parameter char-level Qwen2 and the built-in addition task,
# both created locally (no downloads). Sourced by the run_*.sh scripts; override the paths to use your own.
set -euo pipefail
PYTHON=${PYTHON:-python}
WORKDIR=${WORKDIR:-$HOME/hybridflow_examples}
MODEL_PATH=${MODEL_PATH:-$WORKDIR/models/tiny_char_qwen2}
DATA_DIR=${DATA_DIR:-$WORKDIR/data/synthetic/addition}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

if [ ! -f "$MODEL_PATH/config.json" ]; then
  "$PYTHON" -c "import sys; from hybridflow.utils.tiny_model import make_tiny_checkpoint; make_tiny_checkpoint(sys.argv[1], size='tiny')" "$MODEL_PATH"
fi
if [ ! -f "$DATA_DIR/train.parquet" ]; then
  "$PYTHON" -c "import sys; from hybridflow.data.synthetic import write_synthetic; write_synthetic('addition', sys.argv[1], 2000, 200)" "$DATA_DIR"
fi

# Settings every tiny example shares: CPU, one process, hf rollout, short prompts and answers.
COMMON=(
  data.train_files="$DATA_DIR/train.parquet" data.val_files="$DATA_DIR/test.parquet"
  data.train_batch_size=16 data.max_prompt_length=32 data.max_response_length=4
  actor_rollout_ref.model.path="$MODEL_PATH" actor_rollout_ref.model.enable_gradient_checkpointing=false
  actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.n=4
  actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64
  actor_rollout_ref.actor.optim.lr=1e-4
  reward_model.num_workers=0
  trainer.backend=${BACKEND:-local} trainer.device=cpu trainer.nnodes=1 trainer.n_gpus_per_node=${NGPUS:-1}
  trainer.total_epochs=1 trainer.test_freq=10 trainer.save_freq=-1 trainer.logger=[console,file]
  trainer.project_name=hybridflow_examples
)
