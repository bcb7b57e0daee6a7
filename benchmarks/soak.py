"""200-step soak on a tiny model: does anything grow per step (memory, open files, Ray objects)?

A leak that costs a few KiB per step is invisible in a 2-step test and fatal in a 3-day run, so this runs
the real trainer (``train_ppo``, GRPO, hf rollout) for many steps and samples, after every step:

* RSS of the controller process, and on ``--backend ray`` of each child (Ray daemons, the worker);
* open file descriptors of the controller (``/proc/self/fd``);
* Ray object references held by the controller, on ``--backend ray`` only.

The first ``--warmup`` steps are dropped (allocator pools, lazy imports and the first checkpoint settle
there); the rest is fitted with an ordinary least-squares line, and the slope is reported per step and
extrapolated to 10k steps. A flat run has an RSS slope within noise (|slope| x 10k steps << RSS).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/soak.py [--steps 200] [--backend local|ray]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import slope  # noqa: E402  (least-squares slope, shared with bench_scaling)


def rss_mib() -> float:
    """RSS of this (controller) process."""
    return psutil.Process().memory_info().rss / 2**20


def children_rss_mib() -> dict[str, float]:
    """RSS of each child process (Ray daemons and workers), keyed by a short name, summed per name."""
    out: dict[str, float] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = child.cmdline()
            rss = child.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            continue
        title = cmd[0] if cmd and cmd[0].startswith("ray::") else os.path.basename(cmd[0] if cmd else child.name())
        if "python" in title and len(cmd) > 1:
            title = os.path.basename(cmd[1])
        name = title.split(".")[0].split()[0][:40]
        out[name] = out.get(name, 0.0) + rss
    return out


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def ray_object_count() -> int:
    """Object references the controller holds (the state API needs the dashboard, which the trainer's lean
    Ray leaves off; a controller-side leak of ``ObjectRef``s shows up here as growth)."""
    import ray

    return len(ray._private.worker.global_worker.core_worker.get_all_reference_counts())


class SamplingLogger:
    """A ``Tracking`` stand-in for the trainer's ``logger``: keeps the metrics and samples the process."""

    output_dir = None

    def __init__(self, backend: str):
        self.backend = backend
        self.samples: list[dict[str, float]] = []

    def log(self, data: dict[str, float], step: int) -> None:
        if "timing_s/step" not in data:
            return
        sample = {"step": step, "rss_mib": rss_mib(), "open_fds": open_fds(), "step_s": data["timing_s/step"]}
        if self.backend == "ray":
            sample["ray_objects"] = ray_object_count()
            children = children_rss_mib()
            sample["children_rss_mib"] = sum(children.values())
            sample.update({f"rss_mib[{k}]": v for k, v in children.items()})
        self.samples.append(sample)
        if step % 20 == 0:
            print(json.dumps(sample), flush=True)

    def log_generations(self, samples, step: int) -> None:  # noqa: ARG002 - validation is off in the soak
        return

    def finish(self) -> None:
        return


def overrides(model_dir: Path, data_dir: Path, ckpt_dir: Path, steps: int, backend: str) -> list[str]:
    a = "actor_rollout_ref"
    return [
        f"{a}.model.path={model_dir}", f"data.train_files={data_dir / 'train.parquet'}", "data.val_files=null",
        "data.train_batch_size=8", "data.max_prompt_length=32", "data.max_response_length=8",
        f"{a}.rollout.name=hf", f"{a}.rollout.n=4", f"{a}.actor.ppo_mini_batch_size=8",
        f"{a}.actor.ppo_micro_batch_size_per_gpu=16", f"{a}.rollout.log_prob_micro_batch_size_per_gpu=32",
        f"{a}.ref.log_prob_micro_batch_size_per_gpu=32", f"{a}.actor.use_kl_loss=true", f"{a}.actor.optim.lr=1e-4",
        f"{a}.model.enable_gradient_checkpointing=false", "algorithm.adv_estimator=grpo",
        "reward_model.num_workers=0", f"trainer.backend={backend}", "trainer.device=cpu",
        f"trainer.n_gpus_per_node={1}", f"trainer.total_training_steps={steps}", "trainer.total_epochs=1000",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=50",
        "trainer.max_actor_ckpt_to_keep=1", f"trainer.default_local_dir={ckpt_dir}", "trainer.report=false",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--backend", default="local", choices=["local", "ray"])
    parser.add_argument("--json", default=None, help="also write the per-step samples here")
    args = parser.parse_args()

    from hybridflow.launch.config import load_config
    from hybridflow.data.synthetic import write_synthetic
    from hybridflow.trainer.main_ppo import train_ppo
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    work = Path(tempfile.mkdtemp(prefix="hybridflow_soak_"))
    model_dir = make_tiny_checkpoint(work / "model", size="nano")
    write_synthetic("addition", str(work / "data"), train_size=64, test_size=8, seed=0)
    cfg = load_config(overrides(Path(model_dir), work / "data", work / "ckpt", args.steps, args.backend))
    logger = SamplingLogger(args.backend)
    start = time.perf_counter()
    train_ppo(cfg, logger=logger)
    wall = time.perf_counter() - start

    kept = logger.samples[args.warmup:]
    result = {"steps": len(logger.samples), "backend": args.backend, "wall_s": round(wall, 1),
              "warmup_dropped": args.warmup}
    keys = list(dict.fromkeys(k for s in kept for k in s if k not in ("step", "step_s")))
    for key in keys:
        if all(key in s for s in kept):
            ys = [s[key] for s in kept]
            result[key] = {"first": ys[0], "last": ys[-1], "min": min(ys), "max": max(ys),
                           "slope_per_step": round(slope(ys), 5),
                           "slope_x10k_steps": round(slope(ys) * 10_000, 1)}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": result, "samples": logger.samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
