"""A full GRPO step: hybridflow (local and Ray backends) vs TRL's ``GRPOTrainer``, side by side (spec S15).

Two comparisons, each on one job described once (``GRPOJob``) and run by both frameworks:

* **speed** -- the random-init model (so every completion runs to the full response length), same prompts,
  group size, response length, learning rate, no KL (TRL ``beta=0``, hybridflow ``use_kl_loss=false``), one
  optimizer step per rollout (TRL ``gradient_accumulation_steps=1, num_iterations=1``; hybridflow
  ``ppo_mini_batch_size = train_batch_size, ppo_epochs=1``), token-mean loss (TRL ``loss_type="dapo"``),
  group-std advantages (GRPO, Shao et al. 2024, eq. in §4.1.2), constant LR. Runs alternate between the
  frameworks (ABAB...), each in a fresh process (its own peak RSS); the median step time after warm-up is
  reported, with tokens/s = (prompt+response tokens of the step) / step time, as verl's ``perf/throughput``.
* **accuracy per wall clock** -- both start from the same SFT-warmed checkpoint (from random init neither
  reaches a non-zero accuracy in minutes) and train for the same wall-clock budget; the held-out greedy
  accuracy on the same 200 test prompts is then measured (hybridflow: its validator, greedy ``val_kwargs``;
  TRL: greedy ``generate`` on the trained model, scored by the same ``synthetic/addition`` scorer).

A third row, ``hybridflow_tuned``, flips an existing switch (``rollout.calculate_log_probs=true``: the rollout's
log-probs reused as old log-probs) -- the other way to skip the old log-prob forward, which the defaults now
skip by taking pi_old from the update pass (``StepPlan.old_log_prob_in_update``); the Ray backend is a fourth.
``--baseline-root DIR`` adds a ``hybridflow_baseline`` row: the same job run by another checkout of the
project (e.g. ``git worktree add /tmp/base <commit>``), so a change is measured before/after in one run.
Step times are taken on two clocks: wall, and this process's CPU seconds (local backends only; with one
torch thread the CPU time is the work itself, which a loaded shared machine cannot inflate).
The last line printed is ``ratio_step_time=<hybridflow local median / TRL median>`` (goal <= 0.5).
Run: ``.venv/bin/python benchmarks/bench_vs_trl.py [--quick] [--smoke]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

SCRIPT = Path(__file__).resolve()
VAL_KEYS = ("val-core/synthetic/addition/reward/mean@1", "val-aux/synthetic/addition/reward/mean@1")


# ------------------------------------------------------------------------------------------------ children
def _job_from(args) -> C.GRPOJob:
    data = json.loads(args.job)
    data["extra"] = tuple(data["extra"])
    return C.GRPOJob(**data)


def child_hybridflow(job: C.GRPOJob, budget_s: float | None) -> dict:
    logger = C.run_hybridflow(job.overrides(test_freq=10**9 if budget_s else -1) + ["trainer.logger=[]"],
                              budget_s=budget_s)
    steps = [r[2] for r in logger.records if "timing_s/step" in r[2]]
    tokens = [m["perf/total_num_tokens"] for m in steps]
    acc = next((m[k] for _, _, m in logger.records for k in VAL_KEYS if k in m), None)
    cpu = [0.0] + logger.cpu_per_step() if job.backend == "local" else []  # Ray: the work is in other processes
    return {"step_times": [m["timing_s/step"] for m in steps], "tokens": tokens, "peak_rss_mb": C.peak_rss_mb(),
            "cpu_times": cpu, "stages": {k[len("timing_s/"):]: C.median([m[k] for m in (steps[2:] or steps) if k in m])
                                         for k in steps[-1] if k.startswith("timing_s/")} if steps else {},
            "accuracy": acc, "steps": len(steps), "train_s": logger.records[-1][0] if logger.records else 0.0}


def _trl_dataset(data_dir: str, split: str):
    from datasets import Dataset

    from hybridflow.data.io import read_rows

    rows = read_rows(f"{data_dir}/{split}.parquet")
    return Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]}
                              for r in rows])


def _addition_reward(completions, ground_truth, **_):
    from hybridflow.rewards import default_compute_score

    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(default_compute_score("synthetic/addition", t, g)) for t, g in zip(texts, ground_truth)]


def _greedy_accuracy(model, tokenizer, data_dir: str, max_new_tokens: int) -> float:
    import torch

    rows = _trl_dataset(data_dir, "test")
    texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    tokenizer.padding_side = "left"
    hits = []
    model.eval()
    with torch.no_grad():
        for i in range(0, len(texts), 64):
            enc = tokenizer(texts[i:i + 64], return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
            done = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            hits += _addition_reward(done, rows["ground_truth"][i:i + 64])
    return sum(hits) / len(hits)


def child_trl(job: C.GRPOJob, budget_s: float | None) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(job.seed)
    step_times: list[float] = []
    cpu_times: list[float] = []
    start = time.perf_counter()

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            step_times.append(time.perf_counter() - self.t0)
            cpu_times.append(time.process_time() - self.c0)
            if budget_s is not None and time.perf_counter() - start >= budget_s:
                control.should_training_stop = True

    tokenizer = AutoTokenizer.from_pretrained(job.model)
    model = AutoModelForCausalLM.from_pretrained(job.model, dtype=torch.float32)
    cfg = GRPOConfig(
        output_dir=str(C.DEFAULT_WORKDIR / "trl_out"), per_device_train_batch_size=job.prompts * job.group,
        num_generations=job.group, max_completion_length=job.response_length, learning_rate=job.lr,
        lr_scheduler_type="constant", weight_decay=0.0, beta=job.kl_coef, loss_type="dapo", temperature=1.0,
        max_steps=job.steps if budget_s is None else 10**6, gradient_accumulation_steps=1, num_iterations=1,
        use_cpu=True, bf16=False, use_vllm=False, report_to="none", save_strategy="no", logging_steps=10**6,
        disable_tqdm=True, seed=job.seed, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=_addition_reward, args=cfg,
                          train_dataset=_trl_dataset(job.data_dir, "train"), processing_class=tokenizer,
                          callbacks=[Clock()])
    trainer.train()
    train_s = time.perf_counter() - start
    acc = _greedy_accuracy(trainer.model, tokenizer, job.data_dir, job.response_length) if budget_s else None
    # TRL pads completions to the longest in the batch, so the step's tokens equal hybridflow's when every
    # completion runs to the full length (random-init model); count them the same way.
    tokens = [job.prompts * job.group * (job.prompt_length + job.response_length)] * len(step_times)
    return {"step_times": step_times, "cpu_times": cpu_times, "tokens": tokens, "peak_rss_mb": C.peak_rss_mb(),
            "accuracy": acc,
            "steps": len(step_times), "train_s": train_s}


# ------------------------------------------------------------------------------------------------ parent
# hybridflow_tuned: an existing switch -- reuse the rollout's log-probs as old_log_probs (exactly on-policy
# here, as TRL does with num_iterations=1). The defaults skip that forward pass too (pi_old from the update).
TUNED = ("actor_rollout_ref.rollout.calculate_log_probs=true",)
VARIANTS = {
    "hybridflow": lambda job: job,
    "trl": lambda job: job,
    "hybridflow_tuned": lambda job: replace(job, extra=job.extra + TUNED),
    "hybridflow_ray": lambda job: replace(job, backend="ray"),
    "hybridflow_baseline": lambda job: job,
}
IN_PROCESS = False  # --smoke: run in this process (no interpreter start-up per run; RSS is shared)
BASELINE_ROOT: Path | None = None  # --baseline-root: another checkout that runs the hybridflow_baseline row


def run_baseline(job: C.GRPOJob) -> dict:
    """The hybridflow child of the checkout at ``BASELINE_ROOT`` (its own script, its own package)."""
    script = BASELINE_ROOT / "benchmarks" / SCRIPT.name
    env = C.single_thread_env()
    env["PYTHONPATH"] = str(BASELINE_ROOT) + os.pathsep + env["PYTHONPATH"]
    proc = subprocess.run([sys.executable, str(script), "--child", "hybridflow", "--job", json.dumps(asdict(job))],
                          capture_output=True, text=True, timeout=900, env=env, cwd=BASELINE_ROOT)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"the baseline run in {BASELINE_ROOT} failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}")


def run(framework: str, job: C.GRPOJob, budget_s: float | None = None) -> dict:
    if framework == "hybridflow_baseline":
        return run_baseline(job)
    if IN_PROCESS:
        return child_trl(job, budget_s) if framework == "trl" else child_hybridflow(job, budget_s)
    args = ["--child", framework, "--job", json.dumps(asdict(job))]
    if budget_s is not None:
        args += ["--budget", str(budget_s)]
    return C.run_child(SCRIPT, args)


def speed(job: C.GRPOJob, reps: int, warmup: int, frameworks: list[str]) -> dict[str, dict]:
    """Alternating runs; per framework: median step time after ``warmup`` steps of each run, tokens/s, RSS."""
    acc: dict[str, dict] = {f: {"times": [], "cpu": [], "tps": [], "rss": []} for f in frameworks}
    for rep in range(reps):
        order = frameworks if rep % 2 == 0 else frameworks[::-1]
        for fw in order:
            res = run(fw if fw in ("trl", "hybridflow_baseline") else "hybridflow", VARIANTS[fw](job))
            times, toks = res["step_times"][warmup:], res["tokens"][warmup:]
            acc[fw]["times"] += times
            acc[fw]["cpu"] += res["cpu_times"][warmup:]
            acc[fw]["tps"] += [n / t for n, t in zip(toks, times)]
            acc[fw]["rss"].append(res["peak_rss_mb"])
            stages = "  ".join(f"{k} {v:.3f}" for k, v in res.get("stages", {}).items() if k != "step")
            print(f"  rep {rep} {fw:15s} median step {C.median(times):.3f}s  load {C.machine_state()['load']}"
                  + (f"  [stages: {stages}]" if stages else ""), flush=True)
    return {f: {"median_step_s": C.median(v["times"]), "tokens_per_s": C.median(v["tps"]),
                "median_cpu_s": C.median(v["cpu"]) if v["cpu"] else float("nan"),
                "peak_rss_mb": max(v["rss"])} for f, v in acc.items()}


def accuracy(job: C.GRPOJob, budget_s: float) -> dict[str, dict]:
    out = {}
    for fw in ("hybridflow", "trl"):
        res = run(fw, job, budget_s=budget_s)
        out[fw] = res
        print(f"  {fw:15s} {res['steps']} steps in {res['train_s']:.1f}s -> accuracy {res['accuracy']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and repetitions (~10 min)")
    p.add_argument("--smoke", action="store_true", help="smallest configuration (CI smoke test, < 30 s)")
    p.add_argument("--no-ray", action="store_true", help="skip the Ray backend row")
    p.add_argument("--baseline-root", type=Path, default=None,
                   help="another checkout of hybridflow to run as the hybridflow_baseline row (before/after)")
    p.add_argument("--no-accuracy", action="store_true", help="speed comparison only")
    p.add_argument("--child", choices=["hybridflow", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        job = _job_from(args)
        C.emit_result(child_hybridflow(job, args.budget) if args.child == "hybridflow" else child_trl(job, args.budget))
        return 0

    global IN_PROCESS, BASELINE_ROOT
    IN_PROCESS = args.smoke
    BASELINE_ROOT = args.baseline_root.resolve() if args.baseline_root else None
    work = C.DEFAULT_WORKDIR
    state = C.print_state("GRPO step: hybridflow vs TRL GRPOTrainer")
    data = str(C.task_data(work))
    if args.smoke:
        models, steps, reps, warmup, budget, sft = ["nano"], 3, 1, 1, None, 0
    elif args.quick:
        models, steps, reps, warmup, budget, sft = ["tiny"], 12, 2, 2, 60.0, 300
    else:
        models, steps, reps, warmup, budget, sft = ["tiny", "small"], 20, 3, 3, 180.0, 800
    frameworks = ["hybridflow", "trl", "hybridflow_tuned"] + ([] if args.no_ray or args.smoke else ["hybridflow_ray"])
    frameworks += ["hybridflow_baseline"] if BASELINE_ROOT is not None else []
    if args.no_accuracy:
        budget = None
    rows, ratio, ratio_tuned, cpu_ratio = [], None, None, None
    for size in models:
        job = C.GRPOJob(model=C.base_model(work, size), data_dir=data, prompts=4, group=4, response_length=32,
                        prompt_length=8, lr=5e-5, steps=steps)
        res = speed(job, reps, warmup, frameworks)
        base, cbase = res["trl"]["median_step_s"], res["trl"]["median_cpu_s"]
        for fw, r in res.items():
            rows.append([size, fw, "4x4", 32, r["median_step_s"], r["median_cpu_s"], r["tokens_per_s"],
                         r["peak_rss_mb"], r["median_step_s"] / base, r["median_cpu_s"] / cbase])
        if "hybridflow_baseline" in res:
            b = res["hybridflow_baseline"]
            print(f"step time vs baseline checkout ({size}): wall {res['hybridflow']['median_step_s'] / b['median_step_s']:.3f}, "
                  f"CPU {res['hybridflow']['median_cpu_s'] / b['median_cpu_s']:.3f}")
        if ratio is None:
            ratio = res["hybridflow"]["median_step_s"] / base
            ratio_tuned = res["hybridflow_tuned"]["median_step_s"] / base
            cpu_ratio = res["hybridflow"]["median_cpu_s"] / cbase
    print(f"\nSpeed (median step after {warmup} warm-up steps, {reps} alternating runs each; load {state['load']})")
    C.print_table(["model", "framework", "prompts x group", "resp len", "median step s (wall)", "median CPU s",
                   "tokens/s (wall)", "peak RSS MiB (driver)", "vs TRL (wall)", "vs TRL (CPU)"], rows)
    if budget is not None:
        warm = C.warm_model(work, "tiny", sft)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        start_acc = _greedy_accuracy(AutoModelForCausalLM.from_pretrained(warm), AutoTokenizer.from_pretrained(warm),
                                     data, 4)
        print(f"\nstarting checkpoint (SFT {sft} steps): held-out greedy accuracy {start_acc:.3f}")
        job = C.GRPOJob(model=warm, data_dir=data, prompts=16, group=8, response_length=4, prompt_length=8,
                        lr=5e-5, steps=10**6)
        res = accuracy(job, budget)
        print(f"\nAccuracy after the same wall-clock budget ({budget:.0f}s of training; start: SFT {sft} steps)")
        C.print_table(["framework", "steps done", "train s", "held-out greedy accuracy", "steps/min"],
                      [[fw, r["steps"], r["train_s"], r["accuracy"], 60 * r["steps"] / r["train_s"]]
                       for fw, r in res.items()])
    print(f"cpu_ratio_step_time={cpu_ratio:.3f}  (process CPU seconds per step, hybridflow local / TRL)")
    print(f"ratio_step_time_tuned={ratio_tuned:.3f}")
    print(f"ratio_step_time={ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
