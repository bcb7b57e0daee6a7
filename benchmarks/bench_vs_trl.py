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

``--shape generation`` -- a generation-heavy GRPO step (issue 16 item 2), run by ``main_generation``:
``MODEL_SIZES["medium"]`` (~18M parameters), 32 prompts x 8 samples, responses up to 128 tokens, from an
SFT-warmed checkpoint on the long-tail addition task (``_common.long_tail_task``: the answer then EOS for most
rows, and for a share of them -- ``--long-share``, default 0.25 -- a filler of a length drawn up to the limit),
so the sampled lengths spread from 4 to 128 as a real GRPO batch's do; reward: the answer, exact
(``long_tail_reward.long_tail_score``, the same function for both frameworks).  Same lr, no KL, token-mean loss
(TRL ``loss_type="dapo"``), one optimizer step per rollout, temperature 1.0, same checkpoint.  Each
framework with its best settings on this 2-core machine, every run a fresh process with 2 torch threads:

* ``trl`` -- ``GRPOTrainer`` in one process (torch's default 2 threads on 2 cores), transformers
  ``generate`` (finished rows stay in the batch until the longest ends; completions padded to the longest),
  ``per_device_train_batch_size=256, gradient_accumulation_steps=1``.  Smaller per-device batches with
  accumulation do not cut padded tokens (each slice keeps the generation batch's padded width: TRL 1.16's
  ``_compute_loss`` takes ``logits_to_keep = completion_ids.size(1)``) and TRL's GRPO has no
  ``padding_free``; so not used.  Its old log-prob pass is already skipped (num_iterations=1).
* ``trl_cb`` (opt-in: ``--rows``) -- the same with ``use_transformers_continuous_batching=True``
  (transformers' continuous batching ``generate_batch``, which retires finished rows): TRL's own speed option
  for generation, but several times slower than plain ``generate`` on CPU, so left out by default.
* ``hybridflow`` -- the local backend, one process, 2 torch threads, defaults (hf rollout that retires
  finished rows, padding removed in the update, pi_old taken from the update pass).
* ``hybridflow_dynbsz`` -- plus ``actor.use_dynamic_bsz=true`` with ``ppo_max_token_len_per_gpu`` (token-
  budgeted micro-batches).

Printed per row: median step s (wall, CPU), mean response length, generation s and the rest of the step.
Then accuracy after the same wall-clock budget (``--budget``; the fastest row of each framework, both from the
SFT checkpoint; held-out greedy accuracy on the same 200 test prompts).  Last lines:
``ratio_step_time_generation=<best hybridflow / best TRL>`` (goal <= 0.6) and
``accuracy_delta_generation=<hybridflow - TRL>`` (goal >= 0).
Run: ``.venv/bin/python benchmarks/bench_vs_trl.py --shape generation [--quick | --smoke] [--budget S]``.

``--shape step`` -- the per-step overhead shape of issue 28 item 5 (an independent side by side measured 0.153 s
vs TRL 0.192 on 2026-11-23, then 0.227 vs 0.219): a ~1M-parameter Qwen2 (hidden 192, 2 layers, random init, char
vocabulary), 16 prompts x 8 samples, 4-token answers, one torch thread, local backend, runs interleaved
(ABC, CBA, ...). Rows: ``hybridflow`` (defaults), ``trl`` and ``hybridflow_exact``
(``rollout.exact_log_probs=true`` with ``calculate_log_probs=true``: the cost of exact on-policy log-probs on
this shape); ``--baseline-root DIR`` adds the same job run by another checkout. Last lines: ``ratio_step_time_step=<hybridflow / TRL>`` (goal <= 0.8) and
``ratio_exact_vs_default=<hybridflow_exact / hybridflow>``.
Run: ``.venv/bin/python benchmarks/bench_vs_trl.py --shape step [--quick]``.
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
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

SCRIPT = Path(__file__).resolve()
VAL_KEYS = ("val-core/synthetic/addition/reward/mean@1", "val-aux/synthetic/addition/reward/mean@1")


# ------------------------------------------------------------------------------------------------ children
def child_hybridflow(job: C.GRPOJob, budget_s: float | None) -> dict:
    logger = C.run_hybridflow(job.overrides(test_freq=10**9 if budget_s else -1) + ["trainer.logger=[]"],
                              budget_s=budget_s)
    steps = [r[2] for r in logger.records if "timing_s/step" in r[2]]
    tokens = [m["perf/total_num_tokens"] for m in steps]
    acc = next((m[k] for _, _, m in logger.records for k in VAL_KEYS + (C.LONG_TAIL_VAL_KEY,) if k in m), None)
    cpu = [0.0] + logger.cpu_per_step() if job.backend == "local" else []  # Ray: the work is in other processes
    return {"step_times": [m["timing_s/step"] for m in steps], "tokens": tokens, "peak_rss_mb": C.peak_rss_mb(),
            "gen_times": [m.get("timing_s/gen", float("nan")) for m in steps],
            "resp_len": [m.get("response_length/mean", float("nan")) for m in steps],
            "resp_len_max": [m.get("response_length/max", float("nan")) for m in steps],
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


def _long_tail_reward(completions, ground_truth, **_):
    from long_tail_reward import long_tail_score

    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [long_tail_score(C.LONG_TAIL_SOURCE, t, g) for t, g in zip(texts, ground_truth)]


REWARDS = {"addition": _addition_reward, "long_tail": _long_tail_reward}


def _greedy_accuracy(model, tokenizer, data_dir: str, max_new_tokens: int, task: str = "addition") -> float:
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
            hits += REWARDS[task](done, rows["ground_truth"][i:i + 64])
    return sum(hits) / len(hits)


def child_trl(job: C.GRPOJob, budget_s: float | None, task: str = "addition", opts: dict | None = None) -> dict:
    """``opts``: extra ``GRPOConfig`` fields (the generation shape's ``trl_cb`` row)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(job.seed)
    step_times: list[float] = []
    cpu_times: list[float] = []
    resp_len: list[float] = []
    resp_len_max: list[float] = []
    start = time.perf_counter()

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            step_times.append(time.perf_counter() - self.t0)
            cpu_times.append(time.process_time() - self.c0)
            logged = trainer._metrics["train"]  # this step's (cleared by TRL's log, which runs after this)
            for key, out in (("completions/mean_length", resp_len), ("completions/max_length", resp_len_max)):
                if logged.get(key):
                    out.append(logged[key][-1])
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
        disable_tqdm=True, seed=job.seed, dataloader_num_workers=0, **(opts or {}),
    )
    trainer = GRPOTrainer(model=model, reward_funcs=REWARDS[task], args=cfg,
                          train_dataset=_trl_dataset(job.data_dir, "train"), processing_class=tokenizer,
                          callbacks=[Clock()])
    gen_times: list[float] = []
    generate = trainer._generate_and_score_completions  # generation + reward + advantages, once per step

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            gen_times.append(time.perf_counter() - t0)

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    train_s = time.perf_counter() - start
    acc = _greedy_accuracy(trainer.model, tokenizer, job.data_dir, job.response_length, task) if budget_s else None
    # TRL pads completions to the longest in the batch, so the step's tokens equal hybridflow's when every
    # completion runs to the full length (random-init model); count them the same way.
    tokens = [job.prompts * job.group * (job.prompt_length + job.response_length)] * len(step_times)
    return {"step_times": step_times, "cpu_times": cpu_times, "tokens": tokens, "peak_rss_mb": C.peak_rss_mb(),
            "accuracy": acc, "gen_times": gen_times[:len(step_times)],
            "resp_len": resp_len, "resp_len_max": resp_len_max,
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
    "hybridflow_exact": lambda job: replace(job, extra=job.extra + TUNED + (
        "actor_rollout_ref.rollout.exact_log_probs=true",)),
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


# ------------------------------------------------------------------------------------- generation shape
GEN_THREADS = 2  # every generation-shape run: one process with the machine's 2 cores as torch threads


class GenRow(NamedTuple):  # not a dataclass: the smoke test loads this file outside sys.modules
    """One row of the generation shape: which child runs it and with what on top of the shared job."""

    framework: str  # "hybridflow" | "trl"
    extra: tuple[str, ...] = ()  # hybridflow overrides
    trl_opts: tuple[tuple[str, object], ...] = ()  # GRPOConfig fields

    def settings(self) -> str:
        opts = list(self.extra) + [f"{k}={v}" for k, v in self.trl_opts]
        return f"{GEN_THREADS} threads, 1 process" + ("; " + ", ".join(opts) if opts else "; defaults")


def _gen_rows(job: C.GRPOJob) -> dict[str, GenRow]:
    a = "actor_rollout_ref.actor"
    budget = 16 * (job.prompt_length + job.response_length)  # tokens per micro-batch: ~16 full-length rows
    return {
        "hybridflow": GenRow("hybridflow"),
        "hybridflow_dynbsz": GenRow("hybridflow", (f"{a}.use_dynamic_bsz=true",
                                                   f"{a}.ppo_max_token_len_per_gpu={budget}")),
        "trl": GenRow("trl"),
        "trl_cb": GenRow("trl", trl_opts=(("use_transformers_continuous_batching", True),)),
    }


GEN_ROWS = ("hybridflow", "hybridflow_dynbsz", "trl", "trl_cb")
# trl_cb is opt-in (--rows): transformers' continuous batching is several times slower than its plain
# generate on CPU (smoke run: 24-54 s vs 5-6 s of generation a step), so it is never TRL's best row here.
GEN_DEFAULT_ROWS = ("hybridflow", "hybridflow_dynbsz", "trl")


def run_gen(row: GenRow, job: C.GRPOJob, budget_s: float | None = None) -> dict:
    job = replace(job, extra=job.extra + row.extra)
    opts = dict(row.trl_opts)
    if IN_PROCESS:
        if row.framework == "trl":
            return child_trl(job, budget_s, "long_tail", opts)
        return child_hybridflow(job, budget_s)
    args = ["--child", row.framework, "--job", json.dumps(asdict(job)), "--task", "long_tail",
            "--trl-opts", json.dumps(opts)]
    if budget_s is not None:
        args += ["--budget", str(budget_s)]
    return C.run_child(SCRIPT, args, timeout=3600, threads=GEN_THREADS)


def main_generation(args) -> int:
    global IN_PROCESS
    IN_PROCESS = args.smoke
    work = C.DEFAULT_WORKDIR
    state = C.print_state("generation-heavy GRPO step: hybridflow vs TRL GRPOTrainer")
    if args.smoke:
        size, prompts, group, resp, answer, sft, steps, reps, warmup, budget = "nano", 4, 4, 32, 5, 5, 2, 1, 1, 3.0
    elif args.quick:
        size, prompts, group, resp, answer, sft, steps, reps, warmup, budget = \
            "medium", 32, 8, 128, 400, 40, 3, 1, 1, 120.0
    else:
        size, prompts, group, resp, answer, sft, steps, reps, warmup, budget = \
            "medium", 32, 8, 128, 400, 40, 5, 2, 1, 300.0
    answer = args.answer_steps if args.answer_steps is not None else answer
    sft = args.sft_steps if args.sft_steps is not None else sft
    budget = None if args.no_accuracy else (args.budget if args.budget is not None else budget)
    t0 = time.perf_counter()
    model, data = C.long_tail_task(work, sft, size=size, response_length=resp, long_share=args.long_share,
                                   varied=True, lr=args.sft_lr, batch=64, micro=8, answer_steps=answer)
    print(f"SFT checkpoint: {model} (MODEL_SIZES[{size!r}], {answer} answer-only + {sft} long-tail steps at lr "
          f"{args.sft_lr:g}, long share {args.long_share}; ready in {time.perf_counter() - t0:.0f}s)", flush=True)
    custom = (f"custom_reward_function.path={C.LONG_TAIL_REWARD_FILE}",
              "custom_reward_function.name=long_tail_score", "trainer.balance_batch=false")
    job = C.GRPOJob(model=model, data_dir=str(data), prompts=prompts, group=group, response_length=resp,
                    prompt_length=8, lr=5e-5, steps=steps, extra=custom)
    rows = _gen_rows(job)
    names = args.rows.split(",") if args.rows else list(GEN_DEFAULT_ROWS)
    unknown = sorted(set(names) - set(rows))
    if unknown:
        raise SystemExit(f"unknown row(s) {unknown}; choose from {', '.join(GEN_ROWS)}")
    for name in names:
        print(f"  {name:18s} {rows[name].settings()}", flush=True)
    acc: dict[str, dict[str, list]] = {n: {k: [] for k in ("times", "cpu", "gen", "len", "max", "rss")} for n in names}
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            res = run_gen(rows[name], job)
            a = acc[name]
            a["times"] += res["step_times"][warmup:]
            a["cpu"] += res["cpu_times"][warmup:]
            a["gen"] += res["gen_times"][warmup:]
            a["len"] += res["resp_len"]
            a["max"] += res["resp_len_max"]
            a["rss"].append(res["peak_rss_mb"])
            print(f"  rep {rep} {name:18s} steps {['%.1f' % t for t in res['step_times']]}  gen "
                  f"{['%.1f' % t for t in res['gen_times']]}  resp len {['%.1f' % x for x in res['resp_len']]}  "
                  f"load {C.machine_state()['load']}", flush=True)
    summary = {}
    for name, a in acc.items():
        step, gen = C.median(a["times"]), C.median(a["gen"])
        summary[name] = {"step": step, "cpu": C.median(a["cpu"]) if a["cpu"] else float("nan"), "gen": gen,
                         "len": sum(a["len"]) / max(len(a["len"]), 1), "max": max(a["max"], default=float("nan")),
                         "rss": max(a["rss"])}
    hf = min((n for n in names if rows[n].framework == "hybridflow"), key=lambda n: summary[n]["step"], default=None)
    trl = min((n for n in names if rows[n].framework == "trl"), key=lambda n: summary[n]["step"], default=None)
    base = summary[trl]["step"] if trl else float("nan")
    print(f"\nGeneration-heavy GRPO step (MODEL_SIZES[{size!r}], {prompts} prompts x {group}, responses <= {resp} "
          f"tokens; median after {warmup} warm-up step(s), {reps} alternating run(s) of {steps} steps; "
          f"load {state['load']})")
    C.print_table(["framework", "settings", "median step s (wall)", "median CPU s", "mean resp len", "max resp len",
                   "gen s", "rest s", "peak RSS MiB", "vs best TRL (wall)"],
                  [[n, rows[n].settings(), r["step"], r["cpu"], r["len"], r["max"], r["gen"], r["step"] - r["gen"],
                    r["rss"], r["step"] / base] for n, r in summary.items()])
    delta = None
    if budget is not None and hf and trl:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        start_acc = _greedy_accuracy(AutoModelForCausalLM.from_pretrained(model), AutoTokenizer.from_pretrained(model),
                                     str(data), resp, "long_tail")
        print(f"\nstarting checkpoint (SFT {answer}+{sft} steps): held-out greedy accuracy {start_acc:.3f}", flush=True)
        res = {}
        for name in (hf, trl):
            res[name] = run_gen(rows[name], replace(job, steps=10**6), budget_s=budget)
            print(f"  {name:18s} {res[name]['steps']} steps in {res[name]['train_s']:.1f}s -> accuracy "
                  f"{res[name]['accuracy']}", flush=True)
        print(f"\nAccuracy after the same wall-clock budget ({budget:.0f}s of training each; start {start_acc:.3f})")
        C.print_table(["framework", "steps done", "train s", "held-out greedy accuracy", "steps/min"],
                      [[n, r["steps"], r["train_s"], r["accuracy"], 60 * r["steps"] / r["train_s"]]
                       for n, r in res.items()])
        if res[hf]["accuracy"] is not None and res[trl]["accuracy"] is not None:
            delta = res[hf]["accuracy"] - res[trl]["accuracy"]
    if hf and trl:
        print(f"cpu_ratio_step_time_generation={summary[hf]['cpu'] / summary[trl]['cpu']:.3f}  ({hf} / {trl})")
        print(f"ratio_step_time_generation={summary[hf]['step'] / base:.3f}  ({hf} / {trl})")
        if delta is not None:
            print(f"accuracy_delta_generation={delta:+.3f}  ({hf} - {trl})")
    return 0



# ------------------------------------------------------------------------------------------- step shape
STEP_MODEL = {"hidden_size": 192, "intermediate_size": 640, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2}  # ~1M parameters with the char vocabulary


def step_model(workdir: Path) -> str:
    """The ~1M-parameter random-init Qwen2 of the step shape (cached on disk)."""
    from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

    path = workdir / "models" / "qwen2_1m_s0"
    if not (path / "config.json").exists():
        tok = build_char_tokenizer(chat_template=C.BARE_TEMPLATE)
        model = build_tiny_model(tok, size="tiny", seed=0, **STEP_MODEL)
        path.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(path)
        tok.save_pretrained(path)
    return str(path)


def main_step(args) -> int:
    global IN_PROCESS, BASELINE_ROOT
    IN_PROCESS = args.smoke
    BASELINE_ROOT = args.baseline_root.resolve() if args.baseline_root else None
    work = C.DEFAULT_WORKDIR
    state = C.print_state("per-step overhead shape (~1M Qwen2, 16 x 8, 4-token answers, 1 thread): hybridflow vs TRL")
    steps, reps, warmup = (3, 1, 1) if args.smoke else (12, 2, 2) if args.quick else (20, 3, 3)
    model = step_model(work)
    params = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(model).parameters())
    job = C.GRPOJob(model=model, data_dir=str(C.task_data(work)), prompts=16, group=8, response_length=4,
                    prompt_length=8, lr=5e-5, steps=steps)
    frameworks = ["hybridflow", "trl", "hybridflow_exact"] + (["hybridflow_baseline"] if BASELINE_ROOT else [])
    res = speed(job, reps, warmup, frameworks)
    base, cbase = res["trl"]["median_step_s"], res["trl"]["median_cpu_s"]
    rows = [[fw, r["median_step_s"], r["median_cpu_s"], r["tokens_per_s"], r["peak_rss_mb"],
             r["median_step_s"] / base, r["median_cpu_s"] / cbase] for fw, r in res.items()]
    print(f"\nStep shape ({params / 1e6:.2f}M parameters, 16 prompts x 8, 4-token answers, 1 thread; median after "
          f"{warmup} warm-up steps, {reps} interleaved runs each; load {state['load']})")
    C.print_table(["framework", "median step s (wall)", "median CPU s", "tokens/s (wall)", "peak RSS MiB",
                   "vs TRL (wall)", "vs TRL (CPU)"], rows)
    if BASELINE_ROOT:
        b = res["hybridflow_baseline"]
        print(f"step time vs baseline checkout: wall {res['hybridflow']['median_step_s'] / b['median_step_s']:.3f}, "
              f"CPU {res['hybridflow']['median_cpu_s'] / b['median_cpu_s']:.3f}")
    print(f"ratio_exact_vs_default={res['hybridflow_exact']['median_step_s'] / res['hybridflow']['median_step_s']:.3f}")
    print(f"ratio_step_time_step={res['hybridflow']['median_step_s'] / base:.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and repetitions (~10 min)")
    p.add_argument("--smoke", action="store_true", help="smallest configuration (CI smoke test, < 30 s)")
    p.add_argument("--no-ray", action="store_true", help="skip the Ray backend row")
    p.add_argument("--baseline-root", type=Path, default=None,
                   help="another checkout of hybridflow to run as the hybridflow_baseline row (before/after)")
    p.add_argument("--no-accuracy", action="store_true", help="speed comparison only")
    p.add_argument("--shape", choices=["update", "generation", "step"], default="update",
                   help="update: the update-bound comparison above (default); generation: the generation-heavy "
                        "GRPO step (medium model, 32x8, 128-token long-tail responses); step: issue 28's per-step "
                        "overhead shape (~1M Qwen2, 16x8, 4-token answers)")
    p.add_argument("--long-share", type=float, default=0.25,
                   help="generation shape: share of SFT targets with a filler after the answer")
    p.add_argument("--answer-steps", type=int, default=None,
                   help="generation shape: SFT steps on the answers alone (cheap; default 400)")
    p.add_argument("--sft-steps", type=int, default=None,
                   help="generation shape: SFT steps on the long-tail mix after them (default 40)")
    p.add_argument("--sft-lr", type=float, default=5e-4, help="generation shape: SFT learning rate")
    p.add_argument("--rows", default=None,
                   help=f"generation shape: comma-separated rows of {', '.join(GEN_ROWS)} (default: "
                        f"{','.join(GEN_DEFAULT_ROWS)})")
    p.add_argument("--child", choices=["hybridflow", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=None,
                   help="generation shape: accuracy budget in s of training per framework (default 300, --quick "
                        "120); also the children's budget")
    p.add_argument("--task", default="addition", help=argparse.SUPPRESS)
    p.add_argument("--trl-opts", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        job = C.job_from_json(args.job)
        C.emit_result(child_hybridflow(job, args.budget) if args.child == "hybridflow"
                      else child_trl(job, args.budget, args.task, json.loads(args.trl_opts)))
        return 0
    if args.shape == "generation":
        return main_generation(args)
    if args.shape == "step":
        return main_step(args)

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
