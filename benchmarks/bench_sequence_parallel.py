"""Ulysses sequence parallelism on CPU: per-device peak memory and step time vs SP size at a fixed total
sequence length, with the communication volume beside it (issue 25 item 5).

For each sp in ``--sp`` the script starts ``sp`` processes (gloo, one torch thread each) that form one sp group
(dp = 1) and run the actor's training step on the same micro-batch through the real path: ``TrainEngine`` (FSDP2
over the sp ranks) -> ``response_log_probs(..., sequence_parallel=...)`` (packed row split along the tokens,
all-to-all around attention, gathered log-probs) -> token-mean loss -> backward -> AdamW step.  sp = 1 is one
process without any parallelism.  Per rank and step it records:

* ``peak_rss_mib`` -- the growth of the resident set during the step (``VmHWM`` after the step minus the RSS
  before, with the high-water mark reset through ``/proc/self/clear_refs``): every temporary of the step;
* ``saved_mib`` -- bytes of the tensors autograd keeps for backward (unique storages): the activations that
  sequence parallelism divides, plus the weights the matmuls keep;
* ``step_s`` -- wall time (median of the measured steps);
* ``a2a_mib`` / ``gather_mib`` -- bytes this rank sent in all-to-alls and all-gathers, next to ``a2a_model_mib``,
  the all-to-all volume the layer shapes predict: per layer, forward and backward each move q, k, v and the
  output, (N/sp) x head_dim x (2 H + 2 max(H_kv, sp)) x 4 bytes x (sp - 1)/sp.

The table shows the maximum over the ranks.  On a 2-core machine sp = 4 runs 4 processes on 2 cores, so its
step time measures oversubscription as much as parallelism; memory and bytes do not depend on the cores.

Run: ``.venv/bin/python benchmarks/bench_sequence_parallel.py [--quick] [--smoke] [--tokens N] [--sp 1,2,4]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

SEQUENCES = 2  # the fixed total length is split over this many packed sequences


def _vm(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1)) * 1024


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _batch(tokens: int, vocab: int, prompt: int = 8):
    import torch

    g = torch.Generator().manual_seed(0)
    length = tokens // SEQUENCES
    ids = torch.randint(5, vocab, (SEQUENCES, length), generator=g)
    mask = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": torch.arange(length).expand(SEQUENCES, -1),
            "responses": ids[:, prompt:], "response_mask": mask[:, prompt:].float()}


class _SavedBytes:
    """Unique storage bytes of the tensors autograd saves for backward inside the block."""

    def __init__(self):
        self.seen: dict[int, int] = {}

    def pack(self, t):
        s = t.untyped_storage()
        self.seen[s.data_ptr()] = max(self.seen.get(s.data_ptr(), 0), s.nbytes())
        return t

    @staticmethod
    def unpack(t):
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def _model_a2a_bytes(config, tokens: int, sp: int) -> float:
    if sp == 1:
        return 0.0
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_layer = (tokens / sp) * head_dim * (2 * heads + 2 * max(kv, sp)) * 4 * (sp - 1) / sp
    return 2 * per_layer * config.num_hidden_layers  # forward + backward


def worker(rank: int, world: int, port: int, model_dir: str, tokens: int, steps: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    import warnings

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from hybridflow.launch.config import load_config
    from hybridflow.engine.forward import response_log_probs
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.train_engine import TrainEngine
    from hybridflow.engine.ulysses import COMM

    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu",
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                           "critic.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.optim.lr=1e-5"])
    actor = cfg.actor_rollout_ref.actor
    module = load_causal_lm(model_dir).train()
    engine = TrainEngine(module, actor.fsdp_config, actor.optim, total_training_steps=steps + 1,
                         parallel_dims=ParallelDims(world, sp=world))
    batch = _batch(tokens, module.config.vocab_size)
    n_tokens = float(batch["response_mask"].sum())
    records = []
    for step in range(steps + 1):  # step 0 warms up (allocator, kernels, FSDP buffers)
        if world > 1:
            dist.barrier()
        COMM.reset()
        saved = _SavedBytes()
        exact_peak = _reset_peak()
        rss0 = _vm("VmRSS")
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            lp, _ = response_log_probs(engine.module, batch, sequence_parallel=engine.sequence_parallel)
            loss = -(lp * batch["response_mask"]).sum() / n_tokens
        loss.backward()
        engine.optimizer_step(1.0)
        elapsed = time.perf_counter() - start
        if step == 0:
            continue
        records.append({"step_s": elapsed, "peak_rss_mib": (_vm("VmHWM") - rss0) / 2**20 if exact_peak else float("nan"),
                        "saved_mib": saved.total / 2**20, "a2a_mib": COMM.sent.get("all_to_all", 0.0) / 2**20,
                        "gather_mib": COMM.sent.get("all_gather", 0.0) / 2**20})
    summary = {"step_s": statistics.median(r["step_s"] for r in records),
               **{k: max(r[k] for r in records) for k in ("peak_rss_mib", "saved_mib", "a2a_mib", "gather_mib")},
               "a2a_model_mib": _model_a2a_bytes(module.config, tokens, world) / 2**20}
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(summary))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sp(sp: int, model_dir: str, tokens: int, steps: int, workdir: Path) -> dict:
    out = workdir / f"sp{sp}_{tokens}"
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(sp), port, model_dir, str(tokens),
                               str(steps), str(out)], env=C.single_thread_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(sp)]
    logs = [p.communicate(timeout=3600)[0] for p in procs]
    for r, (p, log) in enumerate(zip(procs, logs)):
        if p.returncode != 0:
            raise RuntimeError(f"sp={sp} rank {r} failed:\n{log[-3000:]}")
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(sp)]
    return {k: max(r[k] for r in ranks) for k in ranks[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4096 tokens, 2 measured steps (a few minutes)")
    ap.add_argument("--smoke", action="store_true", help="smallest run (nano model, 256 tokens, sp 1 and 2)")
    ap.add_argument("--tokens", type=int, default=None, help="total tokens of the micro-batch (default 8192)")
    ap.add_argument("--sp", default=None, help="comma-separated sp sizes (default 1,2,4)")
    ap.add_argument("--size", default=None, help="hybridflow.utils.tiny_model size (default small)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps after one warm-up step")
    ap.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        r, w, port, model, tokens, steps, out = args.worker
        worker(int(r), int(w), int(port), model, int(tokens), int(steps), out)
        return 0
    tokens = args.tokens or (256 if args.smoke else 4096 if args.quick else 8192)
    sizes = [int(x) for x in (args.sp or ("1,2" if args.smoke else "1,2,4")).split(",")]
    size = args.size or ("nano" if args.smoke else "small")
    steps = args.steps or (1 if args.smoke else 2)
    if tokens % (SEQUENCES * max(sizes)):
        ap.error(f"--tokens must be a multiple of {SEQUENCES} x the largest sp")
    from hybridflow.utils.tiny_model import MODEL_SIZES, make_tiny_checkpoint

    workdir = C.DEFAULT_WORKDIR / "sequence_parallel"
    model_dir = workdir / f"model_{size}"
    if not (model_dir / "config.json").is_file():
        make_tiny_checkpoint(model_dir, size=size)  # RoPE extends past max_position_embeddings (2048)
    hidden, _, layers, heads, kv = MODEL_SIZES[size]
    C.print_state(f"Ulysses SP on CPU: {size} ({hidden} hidden, {layers} layers, {heads} heads / {kv} kv), "
                  f"{tokens} tokens in {SEQUENCES} packed sequences, {steps} measured steps")
    rows = {sp: run_sp(sp, str(model_dir), tokens, steps, workdir) for sp in sizes}
    base = rows[sizes[0]]
    print("| sp | processes | tokens / rank | step s | peak RSS growth MiB / rank | saved for backward MiB / rank "
          "| vs sp=1 (saved) | all-to-all MiB sent / rank (model) | all-gather KiB / rank |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sp in sizes:
        r = rows[sp]
        print(f"| {sp} | {sp} | {tokens // sp} | {r['step_s']:.3f} | {r['peak_rss_mib']:.1f} | {r['saved_mib']:.1f} "
              f"| {r['saved_mib'] / base['saved_mib']:.3f} | {r['a2a_mib']:.2f} ({r['a2a_model_mib']:.2f}) "
              f"| {r['gather_mib'] * 1024:.1f} |")
    last = sizes[-1]
    print(f"saved_ratio_sp{last}={rows[last]['saved_mib'] / base['saved_mib']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
