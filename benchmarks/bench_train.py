"""Actor update throughput and achieved FLOP/s vs this machine's fp32 matmul peak (spec S15).

The update goes through the real path -- ``ActorRolloutRefWorker.update_actor`` -> ``PPOActor.update_policy``
-> ``TrainEngine`` (forward, GRPO/PPO clipped loss, backward, AdamW step) -- on a synthetic rollout batch
whose responses have mixed lengths (uniform in [R/4, R]), as RL batches do.

FLOPs follow ``hybridflow.tracking.flops.estimate_flops`` (6·N per token for forward+backward plus the
attention term, Kaplan et al. 2020 / the PaLM MFU definition), counted on the *valid* tokens only, so
padding shows up as lost efficiency. The peak is the best fp32 ``n×n`` matmul rate measured in the same
process with the same thread count. Variants compared side by side (alternating):

* ``packed``   -- rows concatenated into one (no pad tokens computed), forced with ``PPOActor.packed=True``;
  attention runs on a right-padded copy of the sequences (``engine/padded_attention.py``)
* ``trimmed``  -- the padded layout with the columns that are padding in every row cut off, forced with
  ``PPOActor.packed=False``: what the defaults ran on CPU before padded attention
* ``default``  -- ``model.use_remove_padding=true`` as the defaults run it (``engine.forward.use_packed_layout``:
  packed for a text model running sdpa)
* ``dynamic``  -- default + ``actor.use_dynamic_bsz=true`` (micro-batches by token budget)
* ``checkpointed`` -- default + activation checkpointing (every decoder layer recomputed in backward): what
  ``model.enable_gradient_checkpointing=null`` saves when it finds the activations fit (``engine/activation_memory``)
* ``default+old_lp`` / ``default-in-update`` -- the actor's whole share of an on-policy step: the separate
  ``compute_log_prob`` forward followed by the update (before), vs the update alone taking the old
  log-prob from its own pass (``OLD_LOG_PROBS_FROM_UPDATE``, the default since ``StepPlan`` decides it)

Run: ``.venv/bin/python benchmarks/bench_train.py [--quick] [--smoke]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import warnings
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

RMPAD = "actor_rollout_ref.model.use_remove_padding=true"


class Variant(NamedTuple):  # not a dataclass: the smoke test loads this file without registering the module
    overrides: tuple[str, ...]
    packed: bool | None = None  # PPOActor.packed: None = the device decides
    old_log_prob: str = "given"  # given (in the batch) | forward (compute_log_prob first) | update (from its pass)


VARIANTS = {
    "packed": Variant((RMPAD,), packed=True),
    "trimmed": Variant((RMPAD,), packed=False),
    "default": Variant((RMPAD,)),
    "dynamic": Variant((RMPAD, "actor_rollout_ref.actor.use_dynamic_bsz=true")),
    "default+old_lp": Variant((RMPAD,), old_log_prob="forward"),
    "default-in-update": Variant((RMPAD,), old_log_prob="update"),
    "checkpointed": Variant((RMPAD, "actor_rollout_ref.model.enable_gradient_checkpointing=true")),
}


def make_worker(model: str, rows: int, micro: int, max_tokens: int, variant: Variant):
    from hybridflow.launch.config import load_config
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    a = "actor_rollout_ref"
    # The batch brings its own advantages; the GRPO-with-n=1 warning does not apply to this direct update.
    warnings.filterwarnings("ignore", message=".*rollout.n=1.*")
    cfg = load_config([
        f"{a}.model.path={model}", f"{a}.actor.ppo_mini_batch_size={rows}", f"{a}.rollout.n=1",
        f"{a}.actor.ppo_micro_batch_size_per_gpu={micro}", f"{a}.actor.ppo_max_token_len_per_gpu={max_tokens}",
        f"{a}.actor.use_kl_loss=false", f"{a}.actor.entropy_coeff=0", f"{a}.model.enable_gradient_checkpointing=false",
        f"{a}.actor.optim.lr=1e-5", "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
        "algorithm.adv_estimator=grpo", "data.train_batch_size=" + str(rows), *variant.overrides,
    ])
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor")
    worker.init_model(total_training_steps=1000)
    worker.actor.packed = variant.packed
    return worker


def make_batch(vocab: int, rows: int, prompt_len: int, response_len: int, seed: int):
    """Left-padded prompts (full length), right-padded responses of mixed lengths, random advantages."""
    from hybridflow.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, response_len // 4), response_len + 1, (rows,), generator=g)
    prompts = torch.randint(10, vocab, (rows, prompt_len), generator=g)
    responses = torch.randint(10, vocab, (rows, response_len), generator=g)
    response_mask = (torch.arange(response_len)[None, :] < lengths[:, None]).long()
    responses = responses * response_mask  # pad id 0 past each row's length
    attention_mask = torch.cat([torch.ones(rows, prompt_len, dtype=torch.long), response_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    data = DataProto.from_dict({
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask, "position_ids": position_ids, "response_mask": response_mask,
        "old_log_probs": -torch.rand(rows, response_len, generator=g) * 3,
        "advantages": torch.randn(rows, response_len, generator=g),
    })
    data.meta_info["temperature"] = 1.0
    return data, attention_mask.sum(-1).tolist()


def actor_work(worker, data, variant: Variant) -> None:
    """The actor's work for one step of ``variant``: [old log-prob forward +] update."""
    from hybridflow.protocol import DataProto
    from hybridflow.algorithms.batch_ops import OLD_LOG_PROBS_FROM_UPDATE

    if variant.old_log_prob == "forward":
        data = DataProto.from_dict(dict(data.batch), meta_info=dict(data.meta_info))
        data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
    elif variant.old_log_prob == "update":
        data = DataProto.from_dict(dict(data.batch), meta_info={**data.meta_info, OLD_LOG_PROBS_FROM_UPDATE: True})
    worker.update_actor(data)


def measure(worker, data, variant: Variant, steps: int) -> tuple[list[float], list[float]]:
    """Wall and process-CPU seconds per update. With one torch thread the CPU time is the work itself,
    which neighbours on a shared machine cannot inflate (they only add wall-clock waiting)."""
    wall, cpu = [], []
    for _ in range(steps):
        start, cstart = time.perf_counter(), time.process_time()
        actor_work(worker, data, variant)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cstart)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true", help="nano model, 2 steps (CI smoke test)")
    p.add_argument("--size", default=None, help="MODEL_SIZES key (default: medium, nano with --smoke)")
    args = p.parse_args(argv)
    torch.set_num_threads(int(torch.get_num_threads()))
    size = args.size or ("nano" if args.smoke else "medium")
    rows, prompt_len, resp_len, steps, reps = ((8, 8, 16, 2, 1) if args.smoke else
                                               (16, 32, 128, 3, 2) if args.quick else (32, 32, 224, 4, 3))
    micro = 4 if args.smoke else 8
    max_tokens = micro * (prompt_len + resp_len)
    state = C.print_state(f"actor update throughput ({size} model, torch threads {torch.get_num_threads()})")
    from hybridflow.tracking.flops import count_dense_params, estimate_flops, measure_cpu_peak_flops

    model = C.base_model(C.DEFAULT_WORKDIR, size)
    workers = {name: make_worker(model, rows, micro, max_tokens, ov) for name, ov in VARIANTS.items()}
    mcfg = workers["default"].actor_engine.module.config
    n_params = count_dense_params(mcfg)[0]
    data, seqlens = make_batch(mcfg.vocab_size, rows, prompt_len, resp_len, seed=0)
    for name, w in workers.items():  # warm-up: allocator, kernels, optimizer state
        actor_work(w, data, VARIANTS[name])
    times: dict[str, list[float]] = {k: [] for k in workers}
    cpu_times: dict[str, list[float]] = {k: [] for k in workers}
    peaks = []
    for rep in range(reps):
        peaks.append(measure_cpu_peak_flops(size=64 if args.smoke else 1024, repeats=8 + rep))
        for name in (list(workers) if rep % 2 == 0 else list(workers)[::-1]):
            wall, cpu = measure(workers[name], data, VARIANTS[name], steps)
            times[name] += wall
            cpu_times[name] += cpu
    peak = max(peaks)
    valid_tokens = sum(seqlens)
    padded_tokens = rows * (prompt_len + resp_len)
    out_rows = []
    for name, ts in times.items():
        t, ct = C.median(ts), C.median(cpu_times[name])
        achieved = estimate_flops(mcfg, seqlens, t)
        out_rows.append([name, rows, f"{prompt_len}+{resp_len}", valid_tokens, t, ct, valid_tokens / t,
                         achieved / 1e9, achieved / peak, estimate_flops(mcfg, seqlens, ct) / peak])
    print(f"model {size}: {n_params / 1e6:.1f}M matmul params; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s; "
          f"load {state['load']}; valid tokens {valid_tokens} of {padded_tokens} "
          f"({100 * valid_tokens / padded_tokens:.0f}%)")
    C.print_table(["variant", "rows", "prompt+max resp", "valid tokens", "median update s (wall)",
                   "median CPU s", "tokens/s (wall)", "GFLOP/s (wall)", "fraction of peak (wall)",
                   "fraction of peak (CPU time)"], out_rows)
    print("(FLOP/s of the two last rows count the update only: the old log-prob forward is extra work)")
    med = {r[0]: r[5] for r in out_rows}
    print(f"padding_cost={med['trimmed'] / med['packed']:.3f}  (trimmed padded layout / packed update CPU time)")
    print(f"dynamic_cost={med['dynamic'] / med['default']:.3f}  (dynamic bsz / fixed micro-batches CPU time)")
    print(f"old_lp_cost={med['default-in-update'] / med['default+old_lp']:.3f}  "
          "(update taking old log-probs from its pass / old log-prob forward + update, CPU time)")
    print(f"checkpointing_cost={med['checkpointed'] / med['default']:.3f}  (activation checkpointing on / off, CPU time)")
    print(f"mfu_packed={out_rows[0][8]:.3f}  (wall clock; CPU-time based {out_rows[0][9]:.3f})")
    print(f"mfu_trimmed={out_rows[1][8]:.3f}  (wall clock; CPU-time based {out_rows[1][9]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
