#!/usr/bin/env bash
# The wave-4 GPU checks in one device call (run from the repository root on a machine with one NVIDIA GPU, torch and
# transformers installed; ray / vLLM not needed). Each check has its own time limit; every result lands in $OUT
# (or ./gpu_out). Put the printed tables, dated, in benchmarks/RESULTS.md.
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
{ date -u; nvidia-smi -L; $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } 2>&1 | tee "$OUT/machine.txt"
# issue 38: pipeline x tensor parallelism of a Qwen2.5-7B-shaped stage per tp rank, GPipe / 1F1B from it
timeout 90 $PY benchmarks/gpu/bench_pipeline_gpu.py --pp 2,4 --tp 1,2,4 2>&1 | tee "$OUT/pipeline.txt"
# issue 39: the 3D-HybridEngine switch, 7B-shaped Llama (16 of its 32 layers: bytes scale with layers), training tp 4
# -> rollout tp 2 (4 ranks on the one GPU)
timeout 120 $PY benchmarks/gpu/bench_hybrid_switch_gpu.py --layers ${SWITCH_LAYERS:-16} --out "$OUT/hybrid_switch" 2>&1 | tee "$OUT/hybrid_switch.txt"
# issue 36: exact log-probs and the fused head in bf16 / fp32 on CUDA
timeout 90 $PY benchmarks/gpu/check_batch_invariance.py --quick 2>&1 | tee "$OUT/kernels.txt"
echo done
