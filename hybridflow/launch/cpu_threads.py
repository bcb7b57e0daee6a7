"""How many torch threads each CPU worker process of a Ray run gets (its share of the node's cores)."""

from __future__ import annotations

import os


def cpu_threads_per_process(config) -> int:
    """Torch threads of each CPU worker process on Ray. ``OMP_NUM_THREADS`` in the command's environment fixes it
    (as with torchrun); otherwise a node's cores are divided among the run's worker processes on it -- the training
    ranks, plus the rollout pool's when the rollout has its own processes -- at least 1 each. A single-rank command
    line (``trainer.n_gpus_per_node=1``) on a 2-core machine thus trains and generates with both cores
    (``benchmarks/bench_cores.py``, RESULTS section 12). Each process still reserves 1 logical Ray CPU, so reward
    and agent-loop actors keep CPUs to be scheduled on; a node's cores are the fewer of its Ray CPUs and this
    machine's cores (Ray's logical CPUs may be set above the physical ones)."""
    import ray

    fixed = os.environ.get("OMP_NUM_THREADS", "").strip()
    if fixed:
        if not fixed.isdigit() or int(fixed) < 1:
            raise ValueError(f"OMP_NUM_THREADS={fixed!r} in the environment: set it to a whole number >= 1 (the torch "
                             "threads of each worker process) or unset it to divide the cores among the workers")
        return int(fixed)
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cpus = min([int(n["Resources"]["CPU"]) for n in nodes] + [cores])
    processes = int(config.trainer.n_gpus_per_node)
    if not config.actor_rollout_ref.hybrid_engine:
        processes += int(config.rollout.n_gpus_per_node)
    return max(1, cpus // max(1, processes))
