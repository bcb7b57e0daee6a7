"""The same GRPO workload run by the real verl (0.9.1 on CPU) and by hybridflow, interleaved (issue 28 item 4).

verl runs as ``/work/shared/reference/verl-on-cpu.md`` describes: its own PyPI wheel in a venv of its own
(``--verl-python``), made to run on CPU by the external plugin of ``/work/shared/tools/verl-on-cpu`` (loaded through
verl's own ``VERL_USE_EXTERNAL_MODULES`` hook, no edit to verl), with ``run_grpo_cpu.sh``'s command line: a tiny
Qwen2 (0.36 M), 4 prompts x 4, 32-token responses, FSDP2 actor and reference with a KL loss, one process per role
on Ray, one thread each.  hybridflow runs the same keys (verl 0.9's spellings, which it reads) with
``trainer.backend=ray``.  Runs alternate (verl, hybridflow, hybridflow, verl, ...), each a fresh process.

Printed per phase (median over the steps after the first of every run): ``old_log_prob``, ``ref``,
``update_actor``, ``update_critic`` (n/a for GRPO: no critic), ``step`` and ``step - gen`` (verl's ``gen`` is the
plugin's one-request-at-a-time server, not verl's engine: compare generation with ``bench_engines.py``), and the
time to first step (process start to the first step's metrics).  Last line: ``ratio_<phase>=<hybridflow / verl>``
for each phase (goal <= 1.0).

Run: ``python benchmarks/bench_vs_verl.py --verl-python /tmp/verlpeer/venv/bin/python [--rounds 3] [--steps 6]``.
Making the verl venv (2-3 minutes) is described in ``verl-on-cpu.md``; without it the script says so and exits 2.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

TOOLS = Path("/work/shared/tools/verl-on-cpu")
PHASES = ("old_log_prob", "ref", "update_actor", "update_critic", "step", "step_minus_gen")
_METRIC = re.compile(r"(timing_s/[A-Za-z_]+):([-+0-9.eE]+)")
_STEP = re.compile(r"(?:^|\s)step:(\d+)\s")


def assets(peer: Path, python: str) -> Path:
    """verl-on-cpu's tiny model, tokenizer and parquet, plus the plugin and reward where the run script wants them."""
    work = peer / "work"
    if not (work / "tiny_qwen2" / "config.json").exists():
        subprocess.run([python, str(TOOLS / "make_assets.py")], check=True, env={**os.environ, "PEER_DIR": str(peer)},
                       timeout=600)
    for sub, name in (("plugin", "verl_cpu_plugin.py"), ("reward", "shaped_reward.py")):
        (work / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy(TOOLS / name, work / sub / name)
    return work


def _stream(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[list[dict[str, float]], float]:
    """Run ``cmd``; the metrics of every ``step:N - key:value`` console line and the seconds to the first one."""
    start = time.perf_counter()
    first = None
    steps: list[dict[str, float]] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=C.REPO)
    tail: list[str] = []
    try:
        for line in proc.stdout:
            tail = (tail + [line])[-40:]
            found = dict((k, float(v)) for k, v in _METRIC.findall(line))
            if _STEP.search(line) and "timing_s/step" in found:
                first = first if first is not None else time.perf_counter() - start
                steps.append(found)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0 or not steps:
        raise RuntimeError(f"{cmd[0]} failed (rc={proc.returncode}):\n{''.join(tail)}")
    return steps, float(first)


def run_verl(work: Path, python: str, steps: int) -> tuple[list[dict[str, float]], float]:
    env = dict(C.single_thread_env(), PEER_DIR=str(work.parent), W=str(work))
    env["PATH"] = str(Path(python).parent) + os.pathsep + env.get("PATH", "")
    return _stream(["bash", str(TOOLS / "run_grpo_cpu.sh"), f"trainer.total_training_steps={steps}"], env, 1200)


def hybridflow_overrides(work: Path, steps: int) -> list[str]:
    a = "actor_rollout_ref"
    return [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files={work}/data/train.parquet", f"data.val_files={work}/data/test.parquet",
        "data.train_batch_size=4", "data.max_prompt_length=64", "data.max_response_length=32",
        "data.filter_overlong_prompts=False", "data.truncation=error", "data.dataloader_num_workers=0",
        f"{a}.model.path={work}/tiny_qwen2", f"{a}.model.use_remove_padding=False", f"{a}.actor.strategy=fsdp2",
        f"{a}.actor.optim.lr=1e-4", f"{a}.actor.ppo_mini_batch_size=4", f"{a}.actor.ppo_micro_batch_size_per_gpu=4",
        f"{a}.actor.use_kl_loss=True", f"{a}.actor.kl_loss_coef=0.001", f"{a}.actor.entropy_coeff=0",
        f"{a}.rollout.name=hf", f"{a}.rollout.n=4", f"{a}.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"{a}.ref.log_prob_micro_batch_size_per_gpu=4", f"{a}.rollout.agent.num_workers=1", "reward.num_workers=1",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",  # shaped_score below: verl-on-cpu's
        "reward.custom_reward_function.name=shaped_score",  # shaped_reward.py with hybridflow's gsm8k scorer "trainer.device=cpu", "trainer.use_v1=False",
        "trainer.backend=ray", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.critic_warmup=0",
        "trainer.logger=[console]", "trainer.project_name=verl_cpu", "trainer.experiment_name=cpu_grpo",
        "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=False",
        f"trainer.total_training_steps={steps}", "trainer.total_epochs=1", "trainer.report=false",
    ]


def shaped_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """verl-on-cpu's ``shaped_reward.compute_score`` (gsm8k rule score + the share of digits), on hybridflow's
    gsm8k scorer (the same rule) -- that file imports verl."""
    from hybridflow.rewards import default_compute_score

    base = default_compute_score("openai/gsm8k", solution_str, ground_truth)
    base = base["score"] if isinstance(base, dict) else base
    return float(base) + sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))


def run_hybridflow(work: Path, steps: int) -> tuple[list[dict[str, float]], float]:
    return _stream([sys.executable, "-m", "hybridflow.trainer.main_ppo", *hybridflow_overrides(work, steps)],
                   C.single_thread_env(), 1200)


def phases(steps: list[dict[str, float]]) -> dict[str, float | None]:
    rows = steps[1:] or steps
    out: dict[str, float | None] = {}
    for p in PHASES:
        if p == "step_minus_gen":
            vals = [m["timing_s/step"] - m.get("timing_s/gen", 0.0) for m in rows]
        else:
            vals = [m[f"timing_s/{p}"] for m in rows if f"timing_s/{p}" in m]
        out[p] = statistics.median(vals) if vals else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verl-python", default=os.environ.get("VERL_PYTHON", "/tmp/verlpeer/venv/bin/python"))
    p.add_argument("--peer-dir", type=Path, default=Path("/tmp/verlpeer"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args(argv)
    probe = subprocess.run([args.verl_python, "-c", "import verl; print(verl.__version__)"], capture_output=True,
                           text=True) if Path(args.verl_python).exists() else None
    if probe is None or probe.returncode != 0:
        print(f"no verl at {args.verl_python}: make the venv as /work/shared/reference/verl-on-cpu.md says "
              "(torch==2.13.0, then verl==0.9.1[verl-core]) and pass --verl-python", file=sys.stderr)
        return 2
    state = C.print_state(f"GRPO side by side: verl {probe.stdout.strip()} vs hybridflow (Ray, 1 thread per process)")
    work = assets(args.peer_dir, args.verl_python)
    got: dict[str, list[dict]] = {"verl": [], "hybridflow": []}
    for r in range(args.rounds):
        for fw in (("verl", "hybridflow") if r % 2 == 0 else ("hybridflow", "verl")):
            steps, first = (run_verl(work, args.verl_python, args.steps) if fw == "verl"
                            else run_hybridflow(work, args.steps))
            got[fw].append({**phases(steps), "first_step": first})
            print(f"  round {r} {fw:10s} " + "  ".join(f"{k} {v:.3f}" for k, v in got[fw][-1].items() if v is not None),
                  flush=True)
    keys = (*PHASES, "first_step")
    med = {fw: {k: statistics.median([x[k] for x in runs if x[k] is not None]) if any(x[k] is not None for x in runs)
                else None for k in keys} for fw, runs in got.items()}
    rows = [[k, med["verl"][k], med["hybridflow"][k],
             (med["hybridflow"][k] / med["verl"][k]) if med["verl"][k] and med["hybridflow"][k] is not None else "n/a"]
            for k in keys]
    print(f"\nmedians over {args.rounds} interleaved rounds (load {state['load']})")
    C.print_table(["phase (s)", "verl", "hybridflow", "hybridflow / verl"], rows)
    for k, _, _, ratio in rows:
        print(f"ratio_{k}={ratio if isinstance(ratio, str) else f'{ratio:.3f}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
