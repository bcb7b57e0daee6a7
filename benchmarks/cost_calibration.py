"""The CPU side of ``cost_model.py`` (issue 36 item 4): per-operation costs measured on this machine, and the check
of the model's predictions against the real trainer in three layouts (``python benchmarks/cost_model.py --check``).

Measured, never fitted to the runs predicted: one forward and one forward + backward of the ``medium`` model with the
run's kernels, one AdamW step, the hf engine's decode step at two occupancies, gloo's all-reduce / all-gather /
reduce-scatter between two processes, the framework's own time per phase (the ``nano`` model through the same
launcher, layout and token budget) and the two-OpenMP-pool penalty (:func:`pool_penalty`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cost_model import Device, Job, Layout, Shape, step_costs  # noqa: E402

__all__ = ["calibrate_cpu", "calibrate_link", "calibrate_side_by_side", "check", "framework_overhead_s",
           "pool_penalty"]

CHILD = Path(__file__).resolve().with_name("cost_model.py")  # runs one measured trainer job with --child


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
    from async_sim import decode_step_costs
    from hybridflow.rollout.hf.engine import HFRolloutEngine

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

    t0, t1 = decode_step_costs(engine, prompts, (4, rows), reps=2)
    return {"shape": asdict(shape), "threads": threads, "fwd_flops": 2 * shape.matmul_params * tokens / fwd_s,
            "train_flops": 6 * shape.matmul_params * tokens / train_s, "optimizer_s_per_param": opt_s / shape.params,
            "decode_t0": t0, "decode_t1": t1}


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

    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); import cost_calibration; "
            "print('CAL ' + json.dumps(cost_calibration.calibrate_cpu(1)))")
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
    out = C.run_child(CHILD, ["--child", json.dumps(asdict(job))], timeout=900, env=env)
    gen, update = C.median(out["gen"][2:]), C.median(out["update_actor"][2:])
    rest = C.median([s - g - u for s, g, u in zip(out["step"], out["gen"], out["update_actor"])][2:])
    return {"gen": gen, "update": update, "rest": rest}


def run_pool_penalty(threads: int) -> float:
    """:func:`pool_penalty` in a fresh process (this one already has pools of its own)."""
    import subprocess

    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import cost_calibration; "
            f"print(cost_calibration.pool_penalty({threads}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def run_child_job(job_json: str) -> dict:
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
        got = C.run_child(CHILD, ["--child", json.dumps(asdict(job))], timeout=1800, env=env)
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
