"""Async training vs synchronous colocated training on the same 2 cores, with long-tail response lengths.

The workload is the long tail that verl's async modes exist for: 2-digit addition (``"07+45="`` ->
``"052"``) where the SFT warm-up taught the model to answer in 4 tokens most of the time and, in about one
sample in eight, to run on with filler up to the response limit (64 tokens) -- most responses short, a few at
the limit.  The reward is the answer (the first three characters), so the filler costs time, not reward.

Modes, each a fresh process starting from the same SFT checkpoint, the same prompts, GRPO settings and
wall-clock budget:

* ``sync_local`` -- the synchronous HybridFlow step, colocated, in one process with 2 torch threads (the whole
  machine for the one process);
* ``sync_ray`` -- the same on Ray: one colocated worker process (1 thread);
* ``one_step_off`` -- 1 training process + 1 rollout process (1 thread each), batch k+1 generated while batch
  k trains;
* ``fully_async`` -- 1 training process + 1 rollout process, the rollouter streaming prompts
  (``staleness_threshold`` 0.5, partial rollout, a weight sync every 2 steps: a version is 16 prompts and the
  rollouter may run 8 ahead -- one step's worth);
* ``v1_colocate`` -- verl 0.9's V1 ``colocate_async``: one process, 2 threads, one warm-up batch in flight, a step
  trains the first groups to finish and generation is interrupted for the update (staleness bound 2);
* ``v1_separate`` -- V1 ``separate_async``: 1 training + 1 rollout process, a weight push every
  ``parameter_sync_step=2`` mini-batches of ``prompts/2`` (staleness bound 2);
* ``v1_separate_bypass`` -- the same with ``algorithm.rollout_correction.bypass_mode=true`` (the rollout's
  log-probs are pi_old: no old-log-prob forward on the trainer, the bottleneck of this mode here).

Throughput is trained trajectories per second in steady state: from the end of the first step to the end of
the step that crosses the budget (start-up, the first step and the final validation left out).  Accuracy is
the greedy held-out accuracy of the validation that ends each run (200 test prompts never trained on).
The last line is ``ratio_samples_per_s=<best async / best sync>`` (goal >= 1.3) and
``accuracy_delta=<async - sync>`` (goal >= 0).  Run on a quiet machine:
``.venv/bin/python benchmarks/bench_async.py [--budget-s 300] [--modes ...] [--quick | --smoke]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

SCRIPT = Path(__file__).resolve()
RESPONSE_LENGTH = 64
VAL_KEY = C.LONG_TAIL_VAL_KEY
MODES = ("sync_local", "sync_ray", "one_step_off", "fully_async", "v1_colocate", "v1_separate", "v1_separate_bypass")


# ------------------------------------------------------------------------------------------------ fixtures
def prepare(workdir: Path, train_size: int, sft_steps: int, seed: int = 0) -> tuple[str, Path]:
    """Data (train / held-out test parquet) and the SFT-warmed model with the long-tail habit (cached)."""
    return C.long_tail_task(workdir, sft_steps, size="tiny", response_length=RESPONSE_LENGTH, long_share=0.125,
                            train_size=train_size, seed=seed)


def overrides(mode: str, model: str, data: Path, prompts: int, group: int, lr: float, staleness: float = 0.5,
              sync_step: int = 2, local: bool = False) -> list[str]:
    a = "actor_rollout_ref"
    trajectories = prompts * group
    common = [
        f"{a}.model.path={model}", f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        f"data.train_batch_size={prompts}", "data.max_prompt_length=8", f"data.max_response_length={RESPONSE_LENGTH}",
        "data.seed=0", "algorithm.adv_estimator=grpo", f"{a}.rollout.name=hf", f"{a}.rollout.n={group}",
        f"{a}.rollout.calculate_log_probs=true", f"{a}.actor.ppo_mini_batch_size={prompts}",
        f"{a}.actor.ppo_micro_batch_size_per_gpu={trajectories}", f"{a}.rollout.log_prob_micro_batch_size_per_gpu={trajectories}",
        # token-budget micro-batches: the few long rows are not padded into every short one's micro-batch
        f"{a}.actor.use_dynamic_bsz=true", f"{a}.actor.ppo_max_token_len_per_gpu={8 * (8 + RESPONSE_LENGTH)}",
        f"{a}.actor.optim.lr={lr}", f"{a}.actor.optim.weight_decay=0.0", f"{a}.actor.use_kl_loss=false",
        f"{a}.actor.entropy_coeff=0", f"{a}.actor.loss_agg_mode=token-mean", f"{a}.model.use_remove_padding=true",
        f"{a}.model.enable_gradient_checkpointing=false", f"{a}.rollout.agent.num_workers=1",
        "reward_model.num_workers=0", f"custom_reward_function.path={C.LONG_TAIL_REWARD_FILE}", "custom_reward_function.name=long_tail_score",
        "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=100000",
        "trainer.test_freq=100000", "trainer.val_before_train=true", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        "trainer.logger=[]", "trainer.project_name=bench_async", f"trainer.experiment_name={mode}", "trainer.seed=0",
        "trainer.balance_batch=false", "ray_kwargs.ray_init.num_cpus=2",
    ]
    split = [f"{a}.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=1",
             f"{a}.rollout.free_cache_engine=false"]
    ray = "trainer.backend=local" if local else "trainer.backend=ray"  # --smoke: the async modes in one process
    v1_separate = [ray, "trainer.use_v1=true", "trainer.v1.trainer_mode=separate_async",
                   "trainer.v1.separate_async.parameter_sync_step=2", f"{a}.actor.ppo_mini_batch_size={prompts // 2}",
                   "trainer.v1.sampler.max_off_policy_threshold=2", *split]
    return common + {
        "sync_local": ["trainer.backend=local"],
        "sync_ray": [ray],
        "one_step_off": [ray, "async_training.mode=one_step_off",
                         "algorithm.rollout_correction.bypass_mode=true", *split],
        "fully_async": [ray, "async_training.mode=fully_async", "data.train_batch_size=0",
                        f"async_training.staleness_threshold={staleness}",
                        f"async_training.trigger_parameter_sync_step={sync_step}",
                        "async_training.partial_rollout=true", "async_training.use_rollout_log_probs=true", *split],
        # verl 0.9's V1 trainer: colocated async (one process, generation interrupted for the update and resumed on
        # the new weights, one warm-up batch in flight) and separate async (one trainer + one rollout process, a
        # weight push every 2 mini-batches of prompts/2)
        "v1_colocate": ["trainer.backend=local", "trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async",
                        "trainer.v1.sampler.max_off_policy_threshold=2"],
        "v1_separate": v1_separate,
        # the same with the rollout's log-probs as pi_old (verl's bypass mode, as one_step_off): no old_log_prob
        # forward on the trainer, which is the bottleneck of this mode on one core (measured 0.18 of a 0.71 s step)
        "v1_separate_bypass": v1_separate + ["algorithm.rollout_correction.bypass_mode=true"],
    }[mode]


# ------------------------------------------------------------------------------------------------ one run
def child(args) -> None:
    import torch

    torch.set_num_threads(int(args.threads))
    from hybridflow.launch.config import load_config
    from hybridflow.trainer.main_ppo import train_ppo

    marks: list[float] = []

    def stop() -> bool:  # called after each step
        marks.append(time.perf_counter())
        return marks[-1] - marks[0] >= args.budget_s

    logger = C.RecordingLogger()
    cfg = load_config(overrides(args.run, args.model, Path(args.data), args.prompts, args.group, args.lr,
                                args.staleness, args.sync_step, local=args.local))
    history = train_ppo(cfg, logger=logger, should_stop=stop)
    steps = [m for m in history.metrics if "timing_s/step" in m]
    lengths = [m["response_length/mean"] for m in steps]
    trajectories = (len(steps) - 1) * args.prompts * args.group
    seconds = marks[-1] - marks[0] if len(marks) > 1 else float("nan")
    C.emit_result({
        "mode": args.run, "steps": len(steps), "samples_per_s": trajectories / seconds if seconds > 0 else 0.0,
        "seconds": seconds, "accuracy": next((m[VAL_KEY] for m in reversed(history.metrics) if VAL_KEY in m), None),
        "accuracy_before": next((m[VAL_KEY] for m in history.metrics if VAL_KEY in m), None),
        "response_length_mean": sum(lengths) / max(len(lengths), 1),
        "response_clip_ratio": sum(m.get("response_length/clip_ratio", 0.0) for m in steps) / max(len(steps), 1),
        "staleness_mean": sum(m.get("training/staleness/mean", m.get("training/off_policy/trajectory_staleness/mean", 0.0))
                              for m in steps) / max(len(steps), 1),
        "trainer_idle": sum(m.get("trainer/idle_ratio", 0.0) for m in steps) / max(len(steps), 1),
        "timing": {k: _mean(steps, f"timing_s/{k}") for k in ("step", "gen", "reward", "old_log_prob",
                                                             "update_actor", "update_weights", "param_sync")},
        "rollouter_idle": _mean(steps, "rollouter/idle_ratio"),
    })


def _mean(steps: list[dict], key: str) -> float | None:
    values = [m[key] for m in steps if key in m]
    return sum(values) / len(values) if values else None


def run_mode(mode: str, model: str, data: Path, args) -> dict:
    threads = 2 if mode in ("sync_local", "v1_colocate") else 1  # one process: the whole machine
    cmd = [sys.executable, str(SCRIPT), "--run", mode, "--model", model, "--data", str(data), "--threads",
           str(threads), "--budget-s", str(args.budget_s), "--prompts", str(args.prompts), "--group",
           str(args.group), "--lr", str(args.lr), "--staleness", str(args.staleness), "--sync-step",
           str(args.sync_step)] + (["--local"] if args.local else [])
    env = dict(C.single_thread_env(), OMP_NUM_THREADS=str(threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=C.REPO,
                          timeout=args.budget_s * 4 + 900)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"bench_async {mode} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--budget-s", type=float, default=300.0, help="training wall clock per mode")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--staleness", type=float, default=0.5, help="fully async staleness_threshold")
    parser.add_argument("--sync-step", type=int, default=2, help="fully async trigger_parameter_sync_step")
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="budget 120 s per mode")
    parser.add_argument("--smoke", action="store_true", help="tiny: three modes on the local backend, 3 s each")
    parser.add_argument("--local", action="store_true", help="run the Ray modes on the local backend (threads)")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--threads", default="1", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        child(args)
        return 0
    if args.quick:
        args.budget_s = 120.0
    modes = args.modes.split(",")
    if args.smoke:
        args.budget_s, args.prompts, args.group, args.sft_steps, args.local = 3.0, 4, 4, 4, True
        if args.modes == ",".join(MODES):
            modes = ["sync_local", "one_step_off", "fully_async"]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    state = C.print_state("bench_async: async vs synchronous colocated on the same cores, long-tail lengths")
    workdir = C.DEFAULT_WORKDIR
    model, data = prepare(workdir, train_size=4000, sft_steps=args.sft_steps)
    results = []
    for mode in modes:
        start = time.perf_counter()
        results.append(run_mode(mode, model, data, args))
        print(f"[bench_async] {mode}: {results[-1]} ({time.perf_counter() - start:.0f}s)", flush=True)
    C.print_table(["mode", "steps", "samples/s", "acc before", "acc after", "resp len", "clipped", "staleness",
                   "trainer idle"],
                  [[r["mode"], r["steps"], r["samples_per_s"], r["accuracy_before"], r["accuracy"], r["response_length_mean"],
                    r["response_clip_ratio"], r["staleness_mean"], r["trainer_idle"]] for r in results])
    print(f"load after: {'%.2f %.2f %.2f' % os.getloadavg()} (before: {state['load']})")
    sync = [r for r in results if r["mode"].startswith("sync")]
    asyncs = [r for r in results if not r["mode"].startswith("sync")]
    if sync and asyncs:
        best_sync = max(sync, key=lambda r: r["samples_per_s"])
        best_async = max(asyncs, key=lambda r: r["samples_per_s"])
        print(f"ratio_samples_per_s={best_async['samples_per_s'] / best_sync['samples_per_s']:.3f} "
              f"({best_async['mode']} / {best_sync['mode']})")
        if best_async["accuracy"] is not None and best_sync["accuracy"] is not None:
            print(f"accuracy_delta={best_async['accuracy'] - best_sync['accuracy']:+.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
