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

Run: ``python benchmarks/cost_model.py --check`` (~6 min: calibration + 3 real runs) and ``--predict``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
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


# ---------------------------------------------------------------------------------------------- this CPU, measured
def _time(fn, reps: int = 3) -> float:
    import time

    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def calibrate_cpu(threads: int, rows: int = 32, prompt_len: int = 8, response: int = 128, exact: bool = True) -> dict:
    """Per-operation costs of the ``medium`` model on this CPU with ``threads`` torch threads, with the kernels a run
    uses: batch-invariant ones when ``exact`` (exact on-policy log-probs, the CPU default: MKL's strict mode, the
    invariant attention and norms in the trainer's forward and the rollout's decode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import _common as C
    from hybridflow.rollout.hf.engine import HFRolloutEngine
    from hybridflow.rollout.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    path = C.base_model(C.DEFAULT_WORKDIR, "medium")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32)
    shape = Shape.from_config("medium", model.config, 4)
    if exact:
        from hybridflow.rollout.hf.exact import prepare_exact_model

        prepare_exact_model(model, vision=False)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, shape.vocab, (rows, prompt_len + response), generator=g)
    tokens = ids.numel()

    def fwd():
        with torch.no_grad():
            model(input_ids=ids)

    def fwd_bwd():
        logits = model(input_ids=ids).logits
        torch.log_softmax(logits, -1).gather(-1, ids[..., None]).mean().backward()

    model.train()
    fwd_s, train_s = _time(fwd), _time(fwd_bwd)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    opt_s = _time(opt.step)
    model.eval()
    engine = HFRolloutEngine(model, tok, seed=0, exact_log_probs=exact)
    prompts = [ids[i, :prompt_len].tolist() for i in range(rows)]

    def decode_per_step(n: int) -> float:
        run = lambda k: (lambda: engine.generate_batch(  # noqa: E731
            prompts[:n], SamplingParams(max_tokens=k, temperature=1.0, ignore_eos=True)))
        return (_time(run(33), 2) - _time(run(1), 2)) / 32

    occ = (4, rows)
    per = [decode_per_step(n) for n in occ]
    t1 = max(0.0, (per[1] - per[0]) / (occ[1] - occ[0]))
    return {"shape": asdict(shape), "threads": threads, "fwd_flops": 2 * shape.matmul_params * tokens / fwd_s,
            "train_flops": 6 * shape.matmul_params * tokens / train_s, "optimizer_s_per_param": opt_s / shape.params,
            "decode_t0": max(1e-6, per[0] - t1 * occ[0]), "decode_t1": t1}


def pool_penalty(threads: int = 2, reps: int = 2000) -> float:
    """How much slower a decode-sized product runs once a second thread has its own OpenMP pool (the colocated hf
    engine steps in a thread of its own beside the thread that trains): time of a 24 x 512 by 512 x 1408 product in
    a second thread after the first ran one, over its time in the first thread alone.  GNU OpenMP, with more pool
    threads than cores, stops letting idle workers spin, and every parallel region pays a wake-up."""
    import threading
    import time

    import torch

    torch.set_num_threads(threads)
    x, w = torch.randn(24, 512), torch.randn(1408, 512)

    def bench(out: list) -> None:
        for _ in range(100):
            torch.mm(x, w.t())
        t = time.perf_counter()
        for _ in range(reps):
            torch.mm(x, w.t())
        out.append(time.perf_counter() - t)

    alone: list = []
    bench(alone)
    bench(alone)  # the first call pays the pool's start
    alone.pop(0)
    second: list = []
    th = threading.Thread(target=bench, args=(second,))
    th.start()
    th.join()
    return second[0] / alone[0]


def _link_worker(rank: int, port: int, size: int, out) -> None:
    import time

    import warnings

    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x, gathered, half = torch.ones(size // 4), torch.empty(size // 2), torch.empty(size // 8)
    times = {}
    for name, fn in (("all_reduce", lambda: dist.all_reduce(x)),
                     ("all_gather", lambda: dist.all_gather_into_tensor(gathered, x)),
                     ("reduce_scatter", lambda: dist.reduce_scatter_tensor(half, x))):
        fn()
        best = float("inf")
        for _ in range(4):
            dist.barrier()
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        times[name] = best
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def calibrate_side_by_side(processes: int = 2) -> dict:
    """:func:`calibrate_cpu` with one thread in ``processes`` processes at once (their mean)."""
    import subprocess

    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); import cost_model; "
            "print('CAL ' + json.dumps(cost_model.calibrate_cpu(1)))")
    import _common as C

    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=C.single_thread_env()) for _ in range(processes)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        outs.append(json.loads(next(line for line in out.splitlines() if line.startswith("CAL "))[4:]))
    mean = dict(outs[0])
    for k in ("fwd_flops", "train_flops", "optimizer_s_per_param", "decode_t0", "decode_t1"):
        mean[k] = sum(o[k] for o in outs) / len(outs)
    return mean


def calibrate_link(size: int = 32 << 20) -> dict[str, float]:
    """gloo between two processes, bytes/s per device: all-reduce bus bandwidth (ring: 2 (n-1)/n x bytes / time),
    and the bytes a rank receives per second in an all-gather (``size`` from the peer) and a reduce-scatter (half
    of ``size``)."""
    import multiprocessing as mp

    from hybridflow.utils.rendezvous_bind import free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_link_worker, args=(r, port, size, q)) for r in range(2)]
    for p in procs:
        p.start()
    t = q.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    return {"link": size * 2 * (2 - 1) / 2 / t["all_reduce"], "gather": size / t["all_gather"],
            "scatter": size / 2 / t["reduce_scatter"]}


def framework_overhead_s(ranks: int, extra: tuple[str, ...], response: int = 128) -> dict[str, float]:
    """The framework's own time at a layout, per phase: the nano model (0.1 M parameters: its arithmetic is a few ms)
    run through the same launcher, layout and token budget (32 rows x ``response``): its generation (agent loops,
    the rollout server, per-step Python), its update (dispatch, micro-batching, loss, metrics) and the rest of the
    step (reward, advantages, Ray)."""
    import _common as C

    job = C.GRPOJob(model=C.base_model(C.DEFAULT_WORKDIR, "nano"), data_dir=str(C.task_data(C.DEFAULT_WORKDIR)),
                    prompts=8, group=4, response_length=response, steps=6, backend="ray",
                    extra=(f"trainer.n_gpus_per_node={ranks}", *extra))
    env = C.single_thread_env()
    env.pop("OMP_NUM_THREADS", None)
    out = C.run_child(Path(__file__), ["--child", json.dumps(asdict(job))], timeout=900, env=env)
    gen, update = C.median(out["gen"][2:]), C.median(out["update_actor"][2:])
    rest = C.median([s - g - u for s, g, u in zip(out["step"], out["gen"], out["update_actor"])][2:])
    return {"gen": gen, "update": update, "rest": rest}


def run_pool_penalty(threads: int) -> float:
    """:func:`pool_penalty` in a fresh process (this one already has pools of its own)."""
    import subprocess

    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import cost_model; "
            f"print(cost_model.pool_penalty({threads}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _child(job_json: str) -> dict:
    import _common as C

    logger = C.run_hybridflow(list(C.job_from_json(job_json).overrides()) + ["trainer.logger=[]"])
    steps = [m for _, _, m in logger.records if "timing_s/step" in m]
    keys = ("step", "gen", "update_actor", "old_log_prob", "ref", "update_weights")
    out = {k: [m.get(f"timing_s/{k}", 0.0) for m in steps] for k in keys}
    out["response_length"] = [m.get("response_length/mean", 0.0) for m in steps]
    out["prompt_length"] = [m.get("prompt_length/mean", 0.0) for m in steps]
    return out


CHECK_LAYOUTS = {
    # name: (ranks, extra overrides, threads per process for the costs, Layout)
    "1 rank x 2 threads": (1, (), 2, Layout(1)),
    "dp 2 (2 ranks x 1 thread)": (2, (), 1, Layout(2)),
    "tp 2 (megatron, 2 ranks x 1 thread)": (2, ("actor_rollout_ref.actor.strategy=megatron",
                                                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"),
                                            1, Layout(2, tp=2)),
}


def check(steps: int = 6, warmup: int = 2) -> list[dict]:
    """Predicted (from per-operation costs) vs measured (the real trainer, Ray, medium model, 8 prompts x 4 x 128
    tokens) for each of :data:`CHECK_LAYOUTS`."""
    import _common as C

    # 2 threads: one process alone (the 1-rank layout); 1 thread: two processes at once, as the 2-rank layouts run
    # (both cores busy: each measures what it gets beside the other)
    cal = {2: calibrate_cpu(2), 1: calibrate_side_by_side()}
    link = calibrate_link()
    # one thread per process starts no pool workers, so nothing is throttled: 1.0 (the ratio measured there is
    # noise around it, 0.64-0.74 in two runs)
    penalty = {1: 1.0, 2: max(1.0, run_pool_penalty(2))}
    overheads = {name: framework_overhead_s(ranks, extra) for name, (ranks, extra, _, _) in CHECK_LAYOUTS.items()}
    print(f"calibrated: link {json.dumps({k: round(v / 1e9, 3) for k, v in link.items()})} GB/s, two-pool penalty {penalty}, framework (nano at the layout) "
          f"{json.dumps({k: {p: round(v, 3) for p, v in o.items()} for k, o in overheads.items()})} s/step, "
          + ", ".join(f"{t} thread(s): train {c['train_flops'] / 1e9:.1f} GFLOP/s, fwd {c['fwd_flops'] / 1e9:.1f}, "
                      f"decode t0 {c['decode_t0'] * 1e3:.2f} ms t1 {c['decode_t1'] * 1e3:.3f} ms"
                      for t, c in cal.items()), flush=True)
    data = str(C.task_data(C.DEFAULT_WORKDIR))
    model = C.base_model(C.DEFAULT_WORKDIR, "medium")
    rows = []
    for name, (ranks, extra, threads, layout) in CHECK_LAYOUTS.items():
        micro = 32 // ranks * (2 if layout.tp > 1 else 1)
        a = "actor_rollout_ref"
        job = C.GRPOJob(model=model, data_dir=data, prompts=8, group=4, response_length=128, steps=steps,
                        backend="ray", extra=(f"trainer.n_gpus_per_node={ranks}",
                                              f"{a}.actor.ppo_micro_batch_size_per_gpu={micro}",
                                              f"{a}.rollout.log_prob_micro_batch_size_per_gpu={micro}", *extra))
        env = C.single_thread_env()
        env.pop("OMP_NUM_THREADS", None)
        got = C.run_child(Path(__file__), ["--child", json.dumps(asdict(job))], timeout=1800, env=env)
        measured = {k: C.median(v[warmup:]) for k, v in got.items()}
        c = cal[threads]
        shape = Shape(**c["shape"])
        dev = Device(f"cpu x{threads}", train_flops=c["train_flops"], fwd_flops=c["fwd_flops"],
                     decode_t0=c["decode_t0"], decode_t1=c["decode_t1"], mem_bw=float("inf"),
                     decode_flops=float("inf"), link_bw=link["link"], gather_bw=link["gather"],
                     scatter_bw=link["scatter"], optimizer_s_per_param=c["optimizer_s_per_param"],
                     step_overhead_s=overheads[name]["rest"], pool_penalty=penalty[threads])
        lengths = _lengths(measured["response_length"], 128, 32)
        wjob = Job(prompts=8, n=4, prompt_len=measured["prompt_length"], response_lengths=lengths,
                   old_log_prob=measured["old_log_prob"] > 0, ref=measured["ref"] > 0)
        pred = step_costs(shape, dev, wjob, layout)
        # the framework's own time in the two phases (measured on the nano model at this layout) on top
        pred["gen"] += overheads[name]["gen"]
        pred["update_actor"] += overheads[name]["update"]
        pred["step"] += overheads[name]["gen"] + overheads[name]["update"]
        row = {"layout": name}
        for k in ("gen", "update_actor", "step"):
            row[f"{k} predicted"], row[f"{k} measured"] = pred[k], measured[k]
            row[f"{k} ratio"] = pred[k] / measured[k] if measured[k] else float("nan")
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    return rows


def _lengths(mean: float, cap: int, n: int) -> tuple[int, ...]:
    """``n`` lengths with the measured mean: capped responses plus the early stops that bring the mean down."""
    full = int(round(n * (mean - 1) / (cap - 1))) if mean < cap else n
    short = n - full
    rest = (mean * n - full * cap) / short if short else cap
    return tuple([cap] * full + [max(1, int(round(rest)))] * short)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="calibrate on this CPU and compare with 3 real layouts")
    p.add_argument("--predict", action="store_true", help="Qwen2.5-7B GRPO on 8 and 64 H100-class GPUs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        import _common as C

        C.emit_result(_child(args.child))
        return 0
    if args.check:
        import _common as C

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
