"""Controller overheads: Ray start-up, worker-group start-up, and the cost of one group call.

Measures, side by side in one run:
  * ``init_ray`` (a lean local Ray: no dashboard) wall time;
  * creating a 2-rank ``RayWorkerGroup`` (processes start in parallel, each imports torch);
  * the per-call round trip of a ``ONE_TO_ALL`` no-op on 2 workers (median of N calls), next to a raw
    ``ray.get([actor.noop.remote() ...])`` on the same actors, so the controller's own overhead
    (dispatch + poll loop + collect) is the difference;
  * a ``DP_COMPUTE_PROTO`` call on a small batch (chunk + concat), and the same on the local backend.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_controller.py [--calls 200]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hybridflow.controller import (
    ClassWithInitArgs,
    Dispatch,
    LocalResourcePool,
    LocalWorkerGroup,
    Worker,
    register,
)
from hybridflow.protocol import DataProto


class NoopWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def noop(self):
        return None

    @register(Dispatch.DP_COMPUTE_PROTO)
    def identity(self, data: DataProto) -> DataProto:
        return data


def _median_ms(fn, calls: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args()

    t0 = time.perf_counter()
    import ray

    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray

    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    init_ray({"num_cpus": 2})
    t_init = time.perf_counter() - t0

    pool = RayResourcePool([2])
    t0 = time.perf_counter()
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(NoopWorker))
    t_group = time.perf_counter() - t0

    batch = DataProto.from_dict({"input_ids": torch.randint(0, 100, (args.rows, 256)), "mask": torch.ones(args.rows, 256)})
    group_ms = _median_ms(wg.noop, args.calls)
    raw_ms = _median_ms(lambda: ray.get([w.noop.remote() for w in wg.workers]), args.calls)
    proto_ms = _median_ms(lambda: wg.identity(batch), max(20, args.calls // 4))

    local = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(NoopWorker))
    local_noop_ms = _median_ms(local.noop, args.calls)
    local_proto_ms = _median_ms(lambda: local.identity(batch), max(20, args.calls // 4))

    wg.shutdown()
    pool.release()
    t0 = time.perf_counter()
    ray.shutdown()
    t_shutdown = time.perf_counter() - t0

    print(f"import ray + controller          {t_import:8.2f} s")
    print(f"init_ray (local, no dashboard)   {t_init:8.2f} s")
    print(f"RayWorkerGroup, 2 ranks, ready   {t_group:8.2f} s")
    print(f"ray.shutdown                     {t_shutdown:8.2f} s")
    print(f"ONE_TO_ALL no-op, 2 workers      {group_ms:8.3f} ms  (median of {args.calls})")
    print(f"raw ray.get of 2 actor no-ops    {raw_ms:8.3f} ms  -> controller overhead {group_ms - raw_ms:+.3f} ms")
    print(f"DP_COMPUTE_PROTO {args.rows}x256 x2 tensors {proto_ms:8.3f} ms")
    print(f"local backend: no-op {local_noop_ms:.4f} ms, DP_COMPUTE_PROTO {local_proto_ms:.3f} ms")


if __name__ == "__main__":
    main()
