"""A calibrated cost model of one RL step (issue 36 item 4): generation with continuous batching, the forward passes
and the update per parallel layout, the switch between them, pipeline bubbles, weight sync and async overlap.

No GPU cluster is lent to this project, so the figures for one are predicted from per-operation costs: measured on
this CPU (``--calibrate``: one model forward, one forward + backward, one AdamW step, the hf engine's decode step at
two occupancies, a gloo all-reduce between two processes, and the framework's per-step work on a nano model), and
for an H100-class GPU taken from the H200 measurements in ``RESULTS.md`` section 23 plus the datasheet figures listed
in :data:`H100_ASSUMPTIONS`.  ``--check`` then runs the real trainer on this CPU in three layouts and prints predicted
vs measured per phase; ``--predict`` prints tokens/s/GPU for Qwen2.5-7B GRPO on 8 and 64 H100-class GPUs beside
verl's published numbers.

What one synchronous (colocated) step costs, per phase (``Layout``: ``devices`` = dp x tp x pp training ranks, the
rollout as ``devices / rollout_tp`` replicas of ``rollout_tp`` devices each):

* **generation** -- every replica gets ``ceil(rows / replicas)`` requests, all started together; each decode step
  advances every active request one token and costs ``t0 + t1 x active + max(memory, compute)`` where memory is the
  replica's weights plus the active requests' K/V read once (``/ rollout_tp`` each) over the memory bandwidth and
  compute is ``2 x matmul_params x active / rollout_tp`` over the decode FLOP rate; a request leaves when its length
  is reached, so the longest response sets the phase (the long tail).  Prefill: ``2 x matmul_params x prompt
  tokens`` over the forward rate.
* **forward passes** (old log-prob, reference) -- ``2 x matmul_params x tokens / (devices x forward rate)``, times
  ``1 / (1 - bubble)`` with ``bubble = (pp - 1) / (m + pp - 1)`` for ``m`` micro-batches, plus communication.
* **update** -- ``6`` (``8`` with activation recomputation) ``x matmul_params x tokens / (devices x training
  rate)`` with the same bubble, plus the AdamW step over the rank's parameter shard, plus communication.
* **communication** -- FSDP: all-gather of the parameters per forward, again in backward, reduce-scatter of the
  gradients (``(dp - 1) / dp`` of the rank's ``params / (tp x pp)`` bytes each) over the link; tensor parallelism:
  two all-reduces of the rank's activations per layer per forward (two more in backward), ``2 (tp - 1) / tp`` of
  the bytes each.  FSDP's overlap compute on a GPU (``max``), not on this CPU's gloo (sum); tensor parallelism's
  are on the critical path everywhere.
* **switch** -- bytes each rank receives to hold its rollout shard: ``1 / rollout_tp - 1 / (dp x tp x pp)`` of the
  model (the 3D-HybridEngine, ``engine/shard_switch.py``; 0 when the shards are reused in place), or ``1 - 1 /
  (dp x tp x pp)`` for an all-gather into a whole replica.
* **framework** -- reward, advantages, dispatch and logging: a fixed per-step time measured on a nano model.

Async (``mode="async"``, ``rollout_devices`` R generate while the other devices train): the step is simulated with
``async_sim.simulate_async`` on the same decode and training costs (weight sync: the model's bytes over the link).

The measurements and the check live in ``cost_calibration.py``.  Run: ``python benchmarks/cost_model.py --check``
(~9 min: calibration + 3 real runs) and ``--predict``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

__all__ = ["Shape", "Device", "Layout", "Job", "step_costs", "bubble", "switch_bytes", "QWEN25_7B", "H100"]


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's sizes (what the costs need)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = False
    bytes_per_param: int = 2  # bf16 on a GPU; 4 for fp32 on this CPU

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def matmul_params(self) -> int:
        """Parameters a token multiplies through: the layers' projections and the LM head."""
        per_layer = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim + 3 * self.hidden * self.intermediate
        return self.layers * per_layer + self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.matmul_params + (0 if self.tied else self.vocab * self.hidden)

    @property
    def weight_bytes(self) -> int:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_dim * self.bytes_per_param

    @classmethod
    def from_config(cls, name: str, cfg, bytes_per_param: int) -> "Shape":
        return cls(name, cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                   cfg.num_key_value_heads or cfg.num_attention_heads, cfg.vocab_size,
                   bool(getattr(cfg, "tie_word_embeddings", False)), bytes_per_param)


@dataclass(frozen=True)
class Device:
    """Per-device costs (rates in FLOP/s and bytes/s, times in seconds)."""

    name: str
    train_flops: float  # forward + backward of the model, achieved
    fwd_flops: float  # forward only (no autograd), achieved
    decode_t0: float  # decode step, fixed part
    decode_t1: float  # decode step, per active request (scheduling, sampling, small ops)
    mem_bw: float  # bytes/s a decode step reads weights and K/V at
    decode_flops: float  # FLOP/s of a decode step's matmuls
    link_bw: float  # collective bandwidth per device (bus bytes/s)
    optimizer_s_per_param: float  # AdamW step per parameter of the rank's shard
    step_overhead_s: float  # reward, advantages, dispatch, logging per step
    comm_overlap: bool = False  # collectives hidden behind compute (FSDP prefetch on a GPU)
    # (the CPU) generation and training compute slow down by this factor while two OpenMP pools exist
    pool_penalty: float = 1.0
    gather_bw: float = 0.0  # all-gather / reduce-scatter bytes/s received per device (0: link_bw)
    scatter_bw: float = 0.0


@dataclass(frozen=True)
class Layout:
    devices: int  # training (and, colocated, rollout) devices
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    rollout_tp: int = 1
    recompute: bool = False
    mode: str = "sync"  # "sync" (colocated) | "async" (rollout_devices generate, the rest train)
    rollout_devices: int = 0
    switch: str = "reshard"  # "reshard" (3D-HybridEngine) | "allgather" (a whole replica per rank)
    max_staleness: int = 1

    @property
    def train_devices(self) -> int:
        return self.devices - (self.rollout_devices if self.mode == "async" else 0)

    @property
    def dp(self) -> int:
        return self.train_devices // (self.tp * self.pp)


@dataclass(frozen=True)
class Job:
    prompts: int
    n: int
    prompt_len: float
    response_lengths: tuple[int, ...]  # one per request, or a sample to draw from (async)
    old_log_prob: bool = True
    ref: bool = True

    @property
    def rows(self) -> int:
        return self.prompts * self.n

    @property
    def mean_response(self) -> float:
        return sum(self.response_lengths) / len(self.response_lengths)

    @property
    def tokens(self) -> float:
        return self.rows * (self.prompt_len + self.mean_response)


def bubble(pp: int, micro_batches: int) -> float:
    """The 1F1B / GPipe pipeline bubble ``(pp - 1) / (m + pp - 1)``."""
    return (pp - 1) / (micro_batches + pp - 1) if pp > 1 else 0.0


def switch_bytes(shape: Shape, layout: Layout) -> float:
    """Bytes one rank receives at the switch from training to generation (its training shard: 1 / (dp x tp x pp) of
    the model, FSDP sharding over dp; assumed inside its rollout shard)."""
    train_share = 1.0 / layout.train_devices
    if layout.switch == "allgather":
        return shape.weight_bytes * (1.0 - train_share)
    return shape.weight_bytes * max(0.0, 1.0 / layout.rollout_tp - train_share)


def decode_step_s(shape: Shape, dev: Device, active: int, ctx: float, tp_r: int) -> float:
    memory = (shape.weight_bytes + active * ctx * shape.kv_bytes_per_token) / (tp_r * dev.mem_bw)
    compute = 2.0 * shape.matmul_params * active / (tp_r * dev.decode_flops)
    return (dev.decode_t0 + dev.decode_t1 * active) * dev.pool_penalty + max(memory, compute)


def generation_s(shape: Shape, dev: Device, job: Job, replicas: int, tp_r: int) -> float:
    """The slowest replica's generation of its share of the requests (all started together)."""
    per = math.ceil(job.rows / replicas)
    lengths = list(job.response_lengths)
    if len(lengths) < job.rows:  # a sample: repeat it
        lengths = (lengths * math.ceil(job.rows / len(lengths)))[: job.rows]
    worst = 0.0
    for r in range(replicas):
        mine = sorted(lengths[r::replicas][:per], reverse=True)
        if not mine:
            continue
        t = 2.0 * shape.matmul_params * job.prompt_len * len(mine) / (tp_r * dev.fwd_flops)
        active, s = len(mine), 0
        while active:
            s += 1
            t += decode_step_s(shape, dev, active, job.prompt_len + s, tp_r)
            while active and mine[active - 1] <= s:
                active -= 1
        worst = max(worst, t)
    return worst


def _comm_s(shape: Shape, dev: Device, layout: Layout, tokens: float, backward: bool) -> tuple[float, float]:
    """(FSDP seconds, tensor-parallel seconds) of one pass over ``tokens``."""
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    shard_bytes = shape.weight_bytes / (tp * pp)
    moved = shard_bytes * (dp - 1) / dp if dp > 1 else 0.0
    gathers = 2 if backward else 1  # all-gather forward (+ backward), reduce-scatter of the gradients
    fsdp = gathers * moved / (dev.gather_bw or dev.link_bw)
    if backward:
        fsdp += moved / (dev.scatter_bw or dev.link_bw)
    tp_s = 0.0
    if tp > 1:
        act = tokens / dp * shape.hidden * shape.bytes_per_param
        reduces = (4 if backward else 2) * shape.layers / pp
        tp_s = reduces * act * 2 * (tp - 1) / tp / dev.link_bw
    return fsdp, tp_s


def _combine(compute: float, comm: tuple[float, float], dev: Device) -> float:
    """FSDP's collectives overlap compute where the device prefetches; tensor parallelism's are on the critical
    path (each layer waits for its all-reduce)."""
    fsdp, tp_s = comm
    return (max(compute, fsdp) if dev.comm_overlap else compute + fsdp) + tp_s


def forward_s(shape: Shape, dev: Device, job: Job, layout: Layout) -> float:
    compute = 2.0 * shape.matmul_params * job.tokens / (layout.train_devices * dev.fwd_flops) * dev.pool_penalty
    compute /= 1.0 - bubble(layout.pp, layout.micro_batches)
    return _combine(compute, _comm_s(shape, dev, layout, job.tokens, backward=False), dev)


def update_s(shape: Shape, dev: Device, job: Job, layout: Layout) -> float:
    factor = 8.0 if layout.recompute else 6.0
    compute = factor * shape.matmul_params * job.tokens / (layout.train_devices * dev.train_flops) * dev.pool_penalty
    compute /= 1.0 - bubble(layout.pp, layout.micro_batches)
    optimizer = shape.params / layout.train_devices * dev.optimizer_s_per_param
    return _combine(compute, _comm_s(shape, dev, layout, job.tokens, backward=True), dev) + optimizer


def step_costs(shape: Shape, dev: Device, job: Job, layout: Layout) -> dict[str, float]:
    """Predicted seconds per phase of one step, the step, and tokens/s/GPU (verl's ``perf/throughput``: prompt and
    response tokens over step time x devices)."""
    if layout.mode == "async":
        return _async_costs(shape, dev, job, layout)
    out = {"gen": generation_s(shape, dev, job, layout.devices // layout.rollout_tp, layout.rollout_tp),
           "old_log_prob": forward_s(shape, dev, job, layout) if job.old_log_prob else 0.0,
           "ref": forward_s(shape, dev, job, layout) if job.ref else 0.0,
           "update_actor": update_s(shape, dev, job, layout),
           "switch": switch_bytes(shape, layout) / dev.link_bw if layout.devices > 1 else 0.0,
           "framework": dev.step_overhead_s}
    out["step"] = sum(out.values())
    out["tokens_per_s_per_device"] = job.tokens / (out["step"] * layout.devices)
    return out


def _async_costs(shape: Shape, dev: Device, job: Job, layout: Layout) -> dict[str, float]:
    from async_sim import Costs, simulate_async

    tp_r = layout.rollout_tp
    ctx = job.prompt_len + job.mean_response / 2
    per_request = dev.decode_t1 + max(ctx * shape.kv_bytes_per_token / (tp_r * dev.mem_bw),
                                      2.0 * shape.matmul_params / (tp_r * dev.decode_flops))
    t0 = dev.decode_t0 + shape.weight_bytes / (tp_r * dev.mem_bw)
    train_layout = replace(layout, mode="sync", devices=layout.train_devices)
    optimizer = shape.params / layout.train_devices * dev.optimizer_s_per_param
    train = update_s(shape, dev, job, train_layout) - optimizer + (forward_s(shape, dev, job, train_layout)
                                                                   if job.ref else 0.0)
    costs = Costs(lengths=tuple(job.response_lengths), t0=t0, t1=per_request, slots=256,
                  train_s_per_sample=train * layout.train_devices / job.rows,
                  train_fixed_s=dev.step_overhead_s + optimizer,
                  sync_s=shape.weight_bytes / dev.link_bw)
    res = simulate_async(costs, layout.rollout_devices // tp_r, layout.train_devices, job.rows,
                         max_staleness=layout.max_staleness, steps=60, warmup=5)
    step = job.rows / res.samples_per_s
    return {"gen_wait": res.gen_s, "update_actor": res.train_s, "step": step,
            "tokens_per_s_per_device": job.tokens / (step * layout.devices), "staleness_mean": res.staleness_mean}


# ---------------------------------------------------------------------------------------------- a GPU, by assumption
QWEN25_7B = Shape("Qwen2.5-7B", layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064)

H100_ASSUMPTIONS = {
    "train_flops": "470 TFLOP/s bf16: the 7B-shaped stage's forward + backward measured on the H200 (RESULTS section "
                   "23: 3.8 G matmul parameters x 4096 tokens, fwd 0.067 s, bwd 0.132 s); the H100 SXM has the same "
                   "989 TFLOP/s dense bf16 peak",
    "fwd_flops": "465 TFLOP/s: the same stage's forward",
    "mem_bw": "3.35 TB/s HBM3 (datasheet) x 0.8 achieved in decode",
    "decode_flops": "40 % of the 989 TFLOP/s peak for a decode step's skinny matmuls",
    "decode_t0": "3 ms per decode step of scheduling, sampling and kernel launches (CUDA graphs on)",
    "decode_t1": "2 us per active request per step",
    "link_bw": "NVLink 4: 360 GB/s bus bandwidth within a node (NCCL all-reduce on 8 H100 SXM); across nodes "
               "(64 GPUs) 40 GB/s per GPU (8 x 400 Gb/s InfiniBand at 80 %)",
    "optimizer": "AdamW on fp32 master weights and moments: 16 bytes read + 16 written per parameter at 2.5 TB/s",
    "step_overhead_s": "2 s per step of reward, advantages, Ray dispatch and logging",
    "comm_overlap": "FSDP prefetch hides its collectives behind compute",
    "dtype": "bf16 weights in the rollout; activation recomputation on (verl's default for 7B)",
}

H100 = Device("H100-class", train_flops=470e12, fwd_flops=465e12, decode_t0=3e-3, decode_t1=2e-6,
              mem_bw=3.35e12 * 0.8, decode_flops=0.4 * 989e12, link_bw=360e9, optimizer_s_per_param=32 / 2.5e12,
              step_overhead_s=2.0, comm_overlap=True)


def gsm8k_lengths(n: int = 5120, mean: int = 300, cap: int = 1024, seed: int = 0) -> tuple[int, ...]:
    """Response lengths of a GSM8K GRPO batch, by assumption: log-normal around ``mean`` (sigma 0.5), capped."""
    import random

    rng = random.Random(seed)
    mu = math.log(mean) - 0.125
    return tuple(min(cap, max(8, int(rng.lognormvariate(mu, 0.5)))) for _ in range(n))


def predict_gpu() -> list[dict]:
    """Qwen2.5-7B GRPO (verl's gsm8k example shape: 1024 prompts x 5, prompts ~128 tokens, responses <= 1024) on 8
    and 64 H100-class GPUs, colocated sync and separate async; 64 GPUs keep 128 prompts per GPU-node's worth."""
    rows = []
    for gpus in (8, 64):
        prompts = 1024 * gpus // 8
        job = Job(prompts=prompts, n=5, prompt_len=128, response_lengths=gsm8k_lengths(prompts * 5), ref=False)
        dev = H100 if gpus <= 8 else replace(H100, link_bw=40e9)
        layouts = {"sync, FSDP dp, rollout tp 2 (3D switch)": Layout(gpus, rollout_tp=2, recompute=True),
                   "sync, FSDP dp, rollout tp 2 (all-gather)": Layout(gpus, rollout_tp=2, recompute=True,
                                                                      switch="allgather"),
                   "sync, tp 2 training (FSDP over dp), rollout tp 2": Layout(gpus, tp=2, rollout_tp=2, recompute=True),
                   f"async {gpus // 2}:{gpus // 2}, rollout tp 2": Layout(gpus, rollout_tp=2, recompute=True,
                                                                          mode="async", rollout_devices=gpus // 2)}
        for name, layout in layouts.items():
            c = step_costs(QWEN25_7B, dev, job, layout)
            rows.append({"gpus": gpus, "layout": name, **{k: round(v, 3) for k, v in c.items()}})
    return rows


VERL_PUBLISHED = [
    ("verl GRPO, Qwen2-7B-Instruct, 8 GPUs, FSDP2, 1024 x 5, responses <= 1024, rollout tp 2, param+optimizer offload "
     "(eric-haibin-lin/verl-data gsm8k/qwen2-7b-fsdp2.log)", "150-185 s/step; ~1,640 tok/s/GPU if responses average "
     "300 tokens (derived)"),
    ("verl fully async, Qwen2.5-Math-7B, DAPO, 28K responses, H20 (docs/advance/fully_async.md)",
     "64 GPUs: sync 365 s/step, async 32:32 189 s/step (1.92x over 400 steps)"),
    ("NeMo-RL GRPO Llama3.1-8B, 16 x H100, on-policy, mean generation 1019 (performance summary v0.5)",
     "1,581 tok/s/GPU, 92.8 s/step; 1-step off 2,478 tok/s/GPU"),
]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="calibrate on this CPU and compare with 3 real layouts")
    p.add_argument("--predict", action="store_true", help="Qwen2.5-7B GRPO on 8 and 64 H100-class GPUs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        import _common as C
        from cost_calibration import run_child_job

        C.emit_result(run_child_job(args.child))
        return 0
    if args.check:
        import _common as C
        from cost_calibration import check

        C.print_state("cost model: predicted vs measured on this CPU")
        rows = check()
        worst = max(abs(r["step ratio"] - 1) for r in rows)
        print(f"worst_step_error={worst:.3f}")
    if args.predict or not args.check:
        for row in predict_gpu():
            print(json.dumps(row))
        print("assumptions:")
        for k, v in H100_ASSUMPTIONS.items():
            print(f"  {k}: {v}")
        print("published:")
        for what, value in VERL_PUBLISHED:
            print(f"  {what}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
