"""Discrete-event model of synchronous vs separate-async GRPO training on many devices (issue 28 item 6).

This 2-core machine cannot show what the async modes buy at scale: rollout and training share the same two cores,
so there is no idle device for the overlap to fill.  This model gives the figure for ``R`` rollout + ``T`` training
devices from per-phase costs measured here (``--calibrate``) or given on the command line.

What is modelled (all times in seconds):

* **A rollout device** runs continuous batching with ``slots`` sequences: one decode step takes
  ``step_s(active) = t0 + t1 * active``; every active sequence gains one token per step; a sequence of ``L`` tokens
  finishes after ``L`` steps and its slot is refilled at once (if there is work and the staleness gate allows).
  Prefill is folded into ``t0`` (one prompt's prefill is a few decode steps' worth at these prompt lengths).
* **Training a batch** of ``B`` samples on ``D`` devices takes ``B * train_s_per_sample / D + train_fixed_s``
  (data parallel, perfect scaling: the favourable case for the synchronous mode).
* **sync** (verl's default, colocated): every step the ``N = R + T`` devices generate ``B`` samples (``B / N`` each,
  all started together), wait for the slowest device, train on all ``N`` devices, reshard the weights
  (``sync_s``).  A long response holds its device's whole step: the long-tail cost.
* **separate_async** (V1 ``separate_async`` / fully async): ``R`` devices generate without stopping; the ``T``
  training devices take the first ``B`` finished samples (FIFO); after each update the weights are pushed
  (every rollout device stalls ``sync_s``) and new samples start on the new version.  Staleness of a trained
  sample = trainer version - the version it started on; the gate lets a sample start on version ``v`` only while
  the samples started so far fill at most ``v + max_staleness + 1`` batches, and a sample that is still staler
  when trained is dropped (``drop``; its generation counted as wasted).

Throughput is trained samples per second between the end of warm-up step ``warmup`` and the last step.

Known answers (``tests/benchmarks/test_async_sim.py``): no tail and ``t1 = 0`` -> sync step = ``L * t0 +
train + sync`` exactly; async samples/s on the same devices for both phases never exceeds the overlap bound
``(gen + train) / max(gen, train)`` times sync's; ``max_staleness = 0`` cannot beat sync's alternation.

Run: ``python benchmarks/async_sim.py [--calibrate] [--rollout-devices 8 --train-devices 8]``; the last line is
``sim_ratio_samples_per_s=<separate_async / sync>``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

__all__ = ["Costs", "SimResult", "simulate_sync", "simulate_async", "long_tail_lengths"]


@dataclass(frozen=True)
class Costs:
    """Per-phase costs of one device (see the module docstring)."""

    lengths: tuple[int, ...]  # response lengths (decode steps) to draw from, uniformly
    t0: float  # decode step, fixed part (s)
    t1: float = 0.0  # decode step, per active sequence (s)
    slots: int = 64  # sequences a rollout device runs at once
    train_s_per_sample: float = 0.01  # device-seconds of training per sample
    train_fixed_s: float = 0.0  # per training step, whatever the batch (optimizer step, launch)
    sync_s: float = 0.0  # weight sync / reshard per update (s)

    def step_s(self, active: int) -> float:
        return self.t0 + self.t1 * active

    def train_s(self, batch: int, devices: int) -> float:
        return batch * self.train_s_per_sample / devices + self.train_fixed_s


@dataclass
class SimResult:
    samples_per_s: float
    steps: int
    seconds: float
    gen_s: float = 0.0  # sync: mean generation phase per step; async: mean wait of the trainer for data
    train_s: float = 0.0
    staleness_mean: float = 0.0
    staleness_max: int = 0
    dropped: int = 0
    rollout_idle: float = 0.0  # share of rollout device time with no sequence running
    extra: dict = field(default_factory=dict)


def _draw(rng: random.Random, costs: Costs) -> int:
    return costs.lengths[rng.randrange(len(costs.lengths))]


def _device_gen_s(lengths: Sequence[int], costs: Costs) -> float:
    """Generation time of one device given its samples all at once (continuous batching, no refill)."""
    if not lengths:
        return 0.0
    pending = sorted(lengths)
    # waves of at most `slots`: a finished sequence's slot takes the next waiting one
    active: list[int] = []  # remaining tokens of the running sequences (a heap)
    queue = list(reversed(pending))
    elapsed, done_tokens = 0.0, 0
    while queue or active:
        while queue and len(active) < costs.slots:
            heapq.heappush(active, done_tokens + queue.pop())
        # advance to the next completion: all active sequences step together
        nxt = active[0]
        steps = nxt - done_tokens
        # occupancy is constant until the first completion
        elapsed += steps * costs.step_s(len(active))
        done_tokens = nxt
        while active and active[0] == done_tokens:
            heapq.heappop(active)
    return elapsed


def simulate_sync(costs: Costs, devices: int, batch: int, steps: int = 200, warmup: int = 5, seed: int = 0) -> SimResult:
    """The colocated synchronous trainer on ``devices`` devices: generate, then train, then reshard."""
    rng = random.Random(seed)
    clock = gen_total = train_total = 0.0
    start = None
    for step in range(steps):
        lengths = [_draw(rng, costs) for _ in range(batch)]
        shares = [lengths[d::devices] for d in range(devices)]
        gen = max(_device_gen_s(s, costs) for s in shares)
        train = costs.train_s(batch, devices)
        clock += gen + train + costs.sync_s
        if step >= warmup:
            gen_total += gen
            train_total += train
        if step == warmup - 1:
            start = clock
    start = start if start is not None else 0.0
    counted = steps - warmup
    seconds = clock - start
    return SimResult(samples_per_s=counted * batch / seconds, steps=counted, seconds=seconds,
                     gen_s=gen_total / counted, train_s=train_total / counted)


def simulate_async(costs: Costs, rollout_devices: int, train_devices: int, batch: int, max_staleness: int = 1,
                   steps: int = 200, warmup: int = 5, seed: int = 0) -> SimResult:
    """Separate async: ``rollout_devices`` generate continuously, ``train_devices`` train on the first ``batch``
    finished samples; staleness gate and drop as in the module docstring."""
    rng = random.Random(seed)
    version = 0  # the trainer's current policy version (updates done)
    started = 0  # samples started so far
    # per rollout device: running sequences as [remaining tokens, start version]; next event time
    running: list[list[list[int]]] = [[] for _ in range(rollout_devices)]
    free_at = [0.0] * rollout_devices
    stall_until = [0.0] * rollout_devices
    busy_time = [0.0] * rollout_devices
    buffer: list[int] = []  # start versions of finished samples, FIFO
    trainer_free = 0.0
    stale_sum, stale_max, dropped, trained_steps = 0, 0, 0, 0
    wait_total = train_total = 0.0
    start_clock, clock = None, 0.0
    events: list[tuple[float, int, int]] = []  # (time, kind 0=rollout step end / 1=train end, device)
    seq = 0

    def gate_open(v: int) -> bool:
        return started < batch * (v + max_staleness + 1)

    def refill(d: int) -> None:
        nonlocal started
        while len(running[d]) < costs.slots and gate_open(version):
            running[d].append([_draw(rng, costs), version])
            started += 1

    def schedule_rollout(d: int, now: float) -> None:
        nonlocal seq
        refill(d)
        if running[d]:
            begin = max(now, stall_until[d])
            dt = costs.step_s(len(running[d]))
            busy_time[d] += dt
            heapq.heappush(events, (begin + dt, 0, d))
            free_at[d] = begin + dt
        else:
            free_at[d] = -1.0  # idle: woken when the gate opens

    def try_train(now: float) -> None:
        nonlocal trainer_free, wait_total, train_total, stale_sum, stale_max, dropped, seq
        if trainer_free > now:
            return
        while True:
            fresh = [v for v in buffer if version - v <= max_staleness]
            dropped += len(buffer) - len(fresh)
            buffer[:] = fresh
            if len(buffer) < batch:
                return
            taken, buffer[:] = buffer[:batch], buffer[batch:]
            for v in taken:
                stale_sum += version - v
                stale_max = max(stale_max, version - v)
            dt = costs.train_s(batch, train_devices)
            if trained_steps >= warmup:
                wait_total += now - trainer_free
                train_total += dt
            trainer_free = now + dt
            heapq.heappush(events, (trainer_free, 1, -1))
            return

    for d in range(rollout_devices):
        schedule_rollout(d, 0.0)
    while events and trained_steps < steps:
        now, kind, d = heapq.heappop(events)
        clock = now
        if kind == 0:
            for s in running[d]:
                s[0] -= 1
            finished = [s for s in running[d] if s[0] <= 0]
            running[d] = [s for s in running[d] if s[0] > 0]
            buffer.extend(s[1] for s in finished)
            schedule_rollout(d, now)
            try_train(now)
        else:
            trained_steps += 1
            version += 1
            if trained_steps == warmup:
                start_clock = now
            for r in range(rollout_devices):  # the weight push stalls every rollout device
                stall_until[r] = now + costs.sync_s
                if free_at[r] < 0:
                    schedule_rollout(r, now)
            try_train(now)
    counted = trained_steps - warmup
    seconds = clock - (start_clock or 0.0)
    trained = trained_steps * batch
    return SimResult(samples_per_s=counted * batch / seconds if seconds > 0 else 0.0, steps=counted, seconds=seconds,
                     gen_s=wait_total / max(counted, 1), train_s=train_total / max(counted, 1),
                     staleness_mean=stale_sum / max(trained, 1), staleness_max=stale_max, dropped=dropped,
                     rollout_idle=1.0 - sum(busy_time) / (rollout_devices * clock) if clock > 0 else 0.0)


def long_tail_lengths(short: int = 4, long_max: int = 64, long_share: float = 0.125, n: int = 4000,
                      seed: int = 0) -> tuple[int, ...]:
    """A synthetic long tail shaped like bench_async's task (most answers ``short`` tokens, ``long_share`` of
    them a filler of a length drawn up to ``long_max``); ``--calibrate`` measures the real one instead."""
    rng = random.Random(seed)
    return tuple(rng.randint(short + 1, long_max) if rng.random() < long_share else short for _ in range(n))


# ------------------------------------------------------------------------------------------------ calibration
def decode_step_costs(engine, prompts: Sequence[Sequence[int]], occupancies: tuple[int, int],
                      reps: int = 3) -> tuple[float, float]:
    """``(t0, t1)`` of an hf engine's decode step ``t0 + t1 x active``, from the step at two occupancies: per step,
    (time of 33 tokens - time of 1 token) / 32 for the first ``n`` prompts (prefill cancels), best of ``reps`` after a
    warm-up."""
    import time

    from hybridflow.rollout.sampling_params import SamplingParams

    def generate_s(rows_n: int, tokens: int) -> float:
        fixed = SamplingParams(max_tokens=tokens, temperature=1.0, ignore_eos=True)
        batch = prompts[:rows_n]
        engine.generate_batch(batch, fixed)  # warm
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            engine.generate_batch(batch, fixed)
            best = min(best, time.perf_counter() - t)
        return best

    a, b = occupancies
    per_step = [(generate_s(n, 33) - generate_s(n, 1)) / 32 for n in (a, b)]
    t1 = max(0.0, (per_step[1] - per_step[0]) / (b - a))
    return max(1e-6, per_step[0] - t1 * a), t1


def calibrate(samples: int = 512, threads: int = 1, sft_steps: int = 20) -> dict:
    """Measure this machine's costs on bench_async's shape: the SFT checkpoint's response lengths (sampled,
    temperature 1), the hf engine's decode step time at two occupancies (-> t0, t1), the actor's training time per
    sample (forward + backward + optimizer step on batches of the sampled lengths) and a weight sync (the engine's
    update of every parameter from the trainer's state dict)."""
    import time

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _common as C
    from bench_async import RESPONSE_LENGTH, prepare
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.data.io import read_rows
    from hybridflow.rollout.hf.engine import HFRolloutEngine
    from hybridflow.rollout.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    model_path, data = prepare(C.DEFAULT_WORKDIR, train_size=4000, sft_steps=sft_steps)
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="sdpa", dtype=torch.float32)
    rows = read_rows(str(data / "train.parquet"))[:samples]
    prompts = [tok.encode(tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False) for r in rows]
    engine = HFRolloutEngine(model, tok, seed=0)
    outs = engine.generate_batch(prompts, SamplingParams(max_tokens=RESPONSE_LENGTH, temperature=1.0))
    lengths = tuple(len(o.token_ids) for o in outs)

    t0, t1 = decode_step_costs(engine, prompts, (8, 64))
    # training: padded micro-batches of the sampled lengths, as the actor's update (forward, backward, AdamW)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=False)
    rng = random.Random(0)
    batch_n, reps, spent = 64, 3, 0.0
    for rep in range(reps + 1):
        picked = [rng.randrange(len(prompts)) for _ in range(batch_n)]
        seqs = [prompts[i] + list(outs[i].token_ids) for i in picked]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        t = time.perf_counter()
        for m in range(0, batch_n, 16):  # the actor's micro-batches
            logits = model(input_ids=ids[m:m + 16], attention_mask=mask[m:m + 16]).logits
            loss = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[m:m + 16, 1:, None]).mean()
            loss.backward()
        opt.step()
        opt.zero_grad()
        if rep:
            spent += time.perf_counter() - t
    train_s_per_sample = spent / (reps * batch_n)
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    t = time.perf_counter()
    for _ in range(5):
        engine.update_weights(state.items())
    sync_s = (time.perf_counter() - t) / 5
    return {"lengths": lengths, "t0": t0, "t1": t1, "train_s_per_sample": train_s_per_sample, "sync_s": sync_s,
            "mean_length": sum(lengths) / len(lengths), "max_length": max(lengths),
            "long_share": sum(x > 8 for x in lengths) / len(lengths)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calibrate", action="store_true", help="measure the costs on this machine (bench_async's shape)")
    p.add_argument("--costs", type=Path, help="a JSON file of costs (what --calibrate writes with --save)")
    p.add_argument("--save", type=Path, help="write the calibrated costs here")
    p.add_argument("--sft-steps", type=int, default=20, help="--calibrate: bench_async's SFT checkpoint to measure")
    p.add_argument("--rollout-devices", type=int, default=8)
    p.add_argument("--train-devices", type=int, default=8)
    p.add_argument("--batch", type=int, default=512, help="samples per training step (prompts x group)")
    p.add_argument("--slots", type=int, default=64, help="sequences per rollout device")
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--train-scale", type=float, default=1.0,
                   help="multiply the training cost per sample (what-if: a generation-heavy workload)")
    p.add_argument("--length-scale", type=float, default=1.0,
                   help="multiply every response length (what-if: longer responses, same shape of tail)")
    args = p.parse_args(argv)
    if args.calibrate:
        measured = calibrate(sft_steps=args.sft_steps)
        if args.save:
            args.save.write_text(json.dumps(measured))
    elif args.costs:
        measured = json.loads(args.costs.read_text())
    else:
        measured = {"lengths": long_tail_lengths(), "t0": 2.0e-3, "t1": 2.0e-5, "train_s_per_sample": 6.0e-3,
                    "sync_s": 0.01}
    costs = Costs(lengths=tuple(max(1, round(x * args.length_scale)) for x in measured["lengths"]), t0=measured["t0"],
                  t1=measured["t1"], slots=args.slots, train_s_per_sample=measured["train_s_per_sample"] * args.train_scale,
                  sync_s=measured["sync_s"])
    shown = {k: (v if k != "lengths" else f"{len(v)} samples") for k, v in measured.items()}
    print(f"costs: {shown}")
    n = args.rollout_devices + args.train_devices
    sync = simulate_sync(costs, n, args.batch, steps=args.steps)
    rows = [("sync (colocated)", n, sync)]
    for s in sorted({0, 1, 2, args.max_staleness}):
        rows.append((f"separate_async, staleness <= {s}", f"{args.rollout_devices}+{args.train_devices}",
                     simulate_async(costs, args.rollout_devices, args.train_devices, args.batch, s, steps=args.steps)))
    print(f"{'mode':34s} {'devices':>8s} {'samples/s':>10s} {'vs sync':>8s} {'gen/wait s':>10s} {'train s':>8s} "
          f"{'stale mean':>10s} {'max':>4s} {'dropped':>7s}")
    for name, dev, r in rows:
        print(f"{name:34s} {str(dev):>8s} {r.samples_per_s:10.1f} {r.samples_per_s / sync.samples_per_s:8.3f} "
              f"{r.gen_s:10.4f} {r.train_s:8.4f} {r.staleness_mean:10.2f} {r.staleness_max:4d} {r.dropped:7d}")
    # the same N devices split otherwise (a train-heavy workload wants more training devices)
    splits = {r: simulate_async(costs, r, n - r, args.batch, args.max_staleness, steps=args.steps)
              for r in range(1, n)}
    r_best = max(splits, key=lambda r: splits[r].samples_per_s)
    print(f"best split of the {n} devices at staleness <= {args.max_staleness}: {r_best} rollout + {n - r_best} train, "
          f"{splits[r_best].samples_per_s:.1f} samples/s ({splits[r_best].samples_per_s / sync.samples_per_s:.3f}x sync)")
    gen_ideal = _device_gen_s([round(sum(costs.lengths) / len(costs.lengths))] * (args.batch // n), costs)
    print(f"sync step: generation {sync.gen_s:.4f} s ({sync.gen_s / (sync.gen_s + sync.train_s + costs.sync_s):.0%} "
          f"of the step; {sync.gen_s / gen_ideal:.2f}x what every response at the mean length would take), training "
          f"{sync.train_s:.4f} s; overlap bound (gen + train) / max(gen, train) = "
          f"{(sync.gen_s + sync.train_s) / max(sync.gen_s, sync.train_s):.3f}")
    best = max((r for name, _, r in rows[1:] if f"<= {args.max_staleness}" in name), key=lambda r: r.samples_per_s)
    print(f"sim_ratio_best_split={splits[r_best].samples_per_s / sync.samples_per_s:.3f}")
    print(f"sim_ratio_samples_per_s={best.samples_per_s / sync.samples_per_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
