"""Ray backend, real processes: every dispatch mode on 4 CPU ranks, padding, futures, N-D mesh dispatch,
gloo collectives, colocation, split placement, local-vs-Ray equality and resource errors.

One Ray instance for the module; worker-failure tests live in test_ray_failures.py.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from hybridflow.controller import (
    ClassWithInitArgs,
    Dispatch,
    Execute,
    LocalResourcePool,
    LocalWorkerGroup,
    ResourceUnavailableError,
    Worker,
    WorkerError,
    create_colocated_worker_cls,
    make_nd_compute_dataproto_dispatch_fn,
    register,
    register_dispatch_mode,
)
from hybridflow.protocol import DataProto, DataProtoFuture

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

TP = 2  # the 4-rank group is a 2 (dp) x 2 (tp) mesh for N-D dispatch


def _rows(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n, dtype=torch.float32)}, {"tag": [f"r{i}" for i in range(n)]})


def _round_robin(group, items):
    """User mode: item i goes to rank i % world_size."""
    n = group.world_size
    return ([[items[r::n] for r in range(n)]], {})


def _flatten(group, outputs):
    return sorted(x for out in outputs for x in out)


register_dispatch_mode("TEST_ROUND_ROBIN", _round_robin, _flatten)


class DPWorker(Worker):
    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.scale = scale
        self._register_dispatch_collect_info("actor", dp_rank=self.rank // TP, is_collect=self.rank % TP == 0)

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self) -> dict:
        info = self._get_process_info()
        info.update(
            world_size=self.world_size,
            local_world_size=self.local_world_size,
            omp=os.environ["OMP_NUM_THREADS"],
            threads=torch.get_num_threads(),
            env_rank=os.environ["RANK"],
            master=(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
        )
        return info

    @register(Dispatch.ONE_TO_ALL)
    def add(self, a, b=0):
        return self.rank, a + b

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def offset_async(self, base: int) -> int:
        return base + self.rank

    @register(Dispatch.ALL_TO_ALL)
    def echo(self, x, y=None):
        return self.rank, x, y

    @register(Dispatch.DP_COMPUTE)
    def square(self, x):
        return self.rank, x * x

    @register(Dispatch.DP_COMPUTE_PROTO)
    def scaled(self, data: DataProto) -> DataProto:
        n = len(data)
        return DataProto.from_dict(
            {"y": data.batch["x"] * self.scale, "rank": torch.full((n,), self.rank)},
            {"tag": data.non_tensor_batch["tag"]},
        )

    @register(Dispatch.DP_COMPUTE_PROTO)
    def repeat2(self, data: DataProto) -> DataProto:
        return data.repeat(2, interleave=True)  # k outputs per input row, as rollout.n does

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def plus_one_async(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] + 1}, {"tag": data.non_tensor_batch["tag"]})

    @register(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, fn, data: DataProto) -> DataProto:
        return fn(data)

    @register(Dispatch.DP_COMPUTE_METRIC)
    def stats(self, data: DataProto) -> dict:
        return {"rank": self.rank, "rows": len(data), "sum": float(data.batch["x"].sum())}

    @register(Dispatch.RANK_ZERO)
    def only_rank_zero(self):
        return "ran on", self.rank

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def broadcast_but_rank_zero(self, v):
        return self.rank, v

    @register(make_nd_compute_dataproto_dispatch_fn("actor"))
    def nd_rows(self, data: DataProto) -> DataProto:
        # tp peers must see the same rows: all-reduce the row sums over the tp group and compare
        import torch.distributed as dist

        mesh = self.get_device_mesh(("dp", "tp"), (self.world_size // TP, TP))
        s = data.batch["x"].sum().reshape(1)
        peers = s.clone()
        dist.all_reduce(peers, group=mesh.get_group("tp"))
        assert torch.allclose(peers, s * TP), "tp peers got different chunks"
        return DataProto.from_dict({"y": data.batch["x"] * 10, "rank": torch.full((len(data),), self.rank)})

    @register("TEST_ROUND_ROBIN")
    def negate(self, items):
        return [-i for i in items]

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        self.init_distributed()
        t = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @register(Dispatch.ONE_TO_ALL)
    def raise_on(self, rank: int):
        if self.rank == rank:
            raise ValueError(f"planned failure on rank {rank}")
        return self.rank


@pytest.fixture(scope="module")
def ray_session():
    from hybridflow.controller import init_ray

    # classes defined in this (importlib-imported) test module travel to workers by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    init_ray({"num_cpus": 8, "include_dashboard": False})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def wg4(ray_session):
    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool([4])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ray.remote(DPWorker), scale=2.0), role="actor")
    yield wg
    wg.shutdown()
    pool.release()


def test_torchrun_env_threads_and_placement(wg4):
    infos = wg4.whoami()
    assert [i["rank"] for i in infos] == [0, 1, 2, 3] and [i["env_rank"] for i in infos] == ["0", "1", "2", "3"]
    assert [i["local_rank"] for i in infos] == [0, 1, 2, 3]
    assert all(i["world_size"] == 4 and i["local_world_size"] == 4 for i in infos)
    assert all(i["omp"] == "1" and i["threads"] == 1 for i in infos)
    assert len({i["pid"] for i in infos}) == 4 and os.getpid() not in {i["pid"] for i in infos}
    assert len({i["master"] for i in infos}) == 1  # everyone agrees on rank 0's rendezvous


def test_one_to_all_all_to_all_dp_compute(wg4):
    assert wg4.add(1, b=2) == [(r, 3) for r in range(4)]
    assert wg4.echo([10, 11, 12, 13], y=["a", "b", "c", "d"]) == [(0, 10, "a"), (1, 11, "b"), (2, 12, "c"), (3, 13, "d")]
    assert wg4.echo(7) == [(r, 7, None) for r in range(4)]  # not per-rank lists: broadcast
    assert wg4.square([1, 2, 3, 4]) == [(0, 1), (1, 4), (2, 9), (3, 16)]
    with pytest.raises(ValueError, match=r"positional arg 0 as a list of 4 per-rank values, got list of length 3"):
        wg4.square([1, 2, 3])


@pytest.mark.parametrize("n,expected_ranks", [(8, [0, 0, 1, 1, 2, 2, 3, 3]), (7, [0, 0, 1, 1, 2, 2, 3]), (5, [0, 0, 1, 1, 2])])
def test_dp_compute_proto_pads_and_unpads(wg4, n, expected_ranks):
    # n=5 -> padded to 8 (rows 0,1,2 repeated), chunks of 2, the 3 padding rows dropped on collect
    out = wg4.scaled(_rows(n))
    assert out.batch["y"].tolist() == [2.0 * i for i in range(n)]
    assert out.batch["rank"].tolist() == expected_ranks
    assert list(out.non_tensor_batch["tag"]) == [f"r{i}" for i in range(n)]


def test_padding_is_dropped_for_methods_returning_k_rows_per_input(wg4):
    out = wg4.repeat2(_rows(5))  # padded to 8 -> 16 outputs -> the 3 pad rows' 6 outputs dropped
    assert out.batch["x"].tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    chained = wg4.repeat2(wg4.plus_one_async(_rows(5)))  # same through a future (dropped on the workers)
    assert chained.batch["x"].tolist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0]
    assert list(chained.non_tensor_batch["tag"]) == [f"r{i // 2}" for i in range(10)]


def test_proto_with_func_metric_rank_zero_and_user_mode(wg4):
    out = wg4.apply(_times_three, _rows(6))
    assert out.batch["x"].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
    stats = wg4.stats(_rows(6))  # 6 rows padded to 8: rank 3 gets rows 0,1 again
    assert [(s["rank"], s["rows"], s["sum"]) for s in stats] == [(0, 2, 1.0), (1, 2, 5.0), (2, 2, 9.0), (3, 2, 1.0)]
    assert wg4.only_rank_zero() == ("ran on", 0)
    assert wg4.broadcast_but_rank_zero("v") == (0, "v")
    assert wg4.negate([1, 2, 3, 4, 5, 6]) == [-6, -5, -4, -3, -2, -1]


def _times_three(data: DataProto) -> DataProto:
    return DataProto.from_dict({"x": data.batch["x"] * 3})


def test_nd_dispatch_splits_over_dp_replicates_over_tp(wg4):
    assert wg4.dispatch_info("actor") == [(0, True), (0, False), (1, True), (1, False)]
    out = wg4.nd_rows(_rows(5))  # dp=2: padded to 6, chunks of 3; only ranks 0 and 2 collected
    assert out.batch["y"].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert out.batch["rank"].tolist() == [0, 0, 0, 2, 2]


def test_futures_chain_without_waiting_and_with_padding(wg4):
    fut = wg4.plus_one_async(_rows(7))
    assert isinstance(fut, DataProtoFuture)
    fut2 = wg4.plus_one_async(fut)  # 4-way chunk of a future: the workers pad + strip themselves
    out = wg4.nd_rows(fut2)  # and into a 2-way N-D dispatch
    assert out.batch["y"].tolist() == [10.0 * (i + 2) for i in range(7)]
    assert fut2.get().batch["x"].tolist() == [float(i + 2) for i in range(7)]
    assert list(fut2.get().non_tensor_batch["tag"]) == [f"r{i}" for i in range(7)]


def test_ray_refs_from_a_non_blocking_call_feed_the_next_call(wg4):
    refs = wg4.offset_async(100)
    assert len(refs) == 4 and all(isinstance(r, ray.ObjectRef) for r in refs)
    # one ref per rank: ALL_TO_ALL hands ref r to rank r, and Ray resolves it there
    assert wg4.echo(refs) == [(0, 100, None), (1, 101, None), (2, 102, None), (3, 103, None)]


def test_gloo_all_reduce_in_group(wg4):
    assert wg4.all_reduce(1.0) == [10.0] * 4  # 1 + 2 + 3 + 4


def test_remote_exception_names_role_rank_and_traceback(wg4):
    with pytest.raises(WorkerError) as ei:
        wg4.raise_on(2)
    err = ei.value
    assert (err.role, err.worker_class, err.method, err.rank) == ("actor", "DPWorker", "raise_on", 2)
    assert "ValueError: planned failure on rank 2" in err.remote_traceback
    assert 'raise ValueError(f"planned failure on rank {rank}")' in err.remote_traceback
    assert "\x1b[" not in str(err)
    assert wg4.raise_on(99) == [0, 1, 2, 3]  # the group is still usable


def test_local_backend_gives_identical_results(wg4):
    local = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(DPWorker, scale=2.0))
    for n in (3, 8):
        a, b = wg4.scaled(_rows(n)), local.scaled(_rows(n))
        assert torch.equal(a.batch["y"], b.batch["y"]) and list(a.non_tensor_batch["tag"]) == list(b.non_tensor_batch["tag"])
        assert torch.equal(wg4.apply(_times_three, _rows(n)).batch["x"], local.apply(_times_three, _rows(n)).batch["x"])
    fut_ray, fut_local = wg4.plus_one_async(_rows(5)), local.plus_one_async(_rows(5))
    assert torch.equal(wg4.scaled(fut_ray).batch["y"], local.scaled(fut_local).batch["y"])
    assert local.only_rank_zero() == wg4.only_rank_zero()


class ActorRole(Worker):
    def __init__(self, value: float):
        super().__init__()
        self.value = value

    @register(Dispatch.ONE_TO_ALL)
    def get(self):
        return "actor", self.rank, os.getpid(), self.value

    @register(Dispatch.ONE_TO_ALL)
    def set(self, value):
        self.value = value

    @register(Dispatch.ONE_TO_ALL)
    def reduce(self, v: float) -> float:
        import torch.distributed as dist

        self.init_distributed()
        t = torch.tensor([v])
        dist.all_reduce(t)
        return float(t.item())


class CriticRole(Worker):
    def __init__(self, value: float):
        super().__init__()
        self.value = value

    @register(Dispatch.ONE_TO_ALL)
    def get(self):
        return "critic", self.rank, os.getpid(), self.value

    @register(Dispatch.DP_COMPUTE_PROTO)
    def values(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"values": data.batch["x"] + self.value})

    @register(Dispatch.ONE_TO_ALL)
    def reduce(self, v: float) -> float:
        import torch.distributed as dist

        self.init_distributed()  # the actor role already joined: idempotent, same process group
        t = torch.tensor([v])
        dist.all_reduce(t)
        return float(t.item())


def test_colocated_roles_share_a_process_split_pools_do_not(wg4):
    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool([2])
    host = create_colocated_worker_cls(
        {"actor": RayClassWithInitArgs(ray.remote(ActorRole), 1.0), "critic": RayClassWithInitArgs(CriticRole, value=5.0)}
    )
    wg = RayWorkerGroup(pool, host)
    try:
        roles = wg.spawn({"actor", "critic"})
        actor, critic = roles["actor"], roles["critic"]
        assert actor.method_names == ["get", "reduce", "set"] and critic.method_names == ["get", "reduce", "values"]
        actor.set(3.0)
        a, c = actor.get(), critic.get()
        assert [x[3] for x in a] == [3.0, 3.0] and [x[3] for x in c] == [5.0, 5.0]
        assert [x[2] for x in a] == [x[2] for x in c]  # same pid per rank
        assert a[0][2] != a[1][2]
        assert critic.values(_rows(3)).batch["values"].tolist() == [5.0, 6.0, 7.0]
        assert actor.reduce(1.0) == [2.0, 2.0] and critic.reduce(2.0) == [4.0, 4.0]
        # split placement: a group on another pool has its own processes and its own process group
        assert not {x[2] for x in a} & {i["pid"] for i in wg4.whoami()}
        assert pool.get_placement_groups()[0].id != wg4.resource_pool.get_placement_groups()[0].id
        assert wg4.all_reduce(1.0) == [10.0] * 4
        assert not hasattr(critic, "set")  # each view exposes only its own role's methods
    finally:
        wg.shutdown()
        pool.release()


def test_threads_per_worker_sets_each_process_torch_threads(ray_session):
    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool([1], threads_per_worker=2)  # reserves 1 logical CPU, runs 2 torch threads
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ray.remote(DPWorker)), role="actor")
    try:
        assert pool.bundle == {"CPU": 1.0}
        assert [(i["omp"], i["threads"]) for i in wg.whoami()] == [("2", 2)]
    finally:
        wg.shutdown()
        pool.release()
    with pytest.raises(ValueError, match="threads_per_worker must be >= 1"):
        RayResourcePool([1], threads_per_worker=0)


def _placement(n_gpus: int, hybrid: bool = True, rollout_gpus: int = 0):
    from types import SimpleNamespace as NS

    return NS(trainer=NS(n_gpus_per_node=n_gpus), actor_rollout_ref=NS(hybrid_engine=hybrid),
              rollout=NS(n_gpus_per_node=rollout_gpus))


def test_cpu_workers_share_the_machine_cores_unless_omp_num_threads_is_set(ray_session, monkeypatch):
    from hybridflow.launch.cpu_threads import cpu_threads_per_process

    cores = len(os.sched_getaffinity(0))  # the session asks Ray for 8 logical CPUs: the cores bound it
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cpu_threads_per_process(_placement(1)) == min(8, cores)
    assert cpu_threads_per_process(_placement(2)) == max(1, min(8, cores) // 2)
    assert cpu_threads_per_process(_placement(1, hybrid=False, rollout_gpus=1)) == max(1, min(8, cores) // 2)
    assert cpu_threads_per_process(_placement(16)) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads_per_process(_placement(2)) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS='two'.*whole number"):
        cpu_threads_per_process(_placement(1))


def test_max_colocate_count_allows_separate_processes_per_bundle(ray_session):
    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool([1], max_colocate_count=2)
    a = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRole, 1.0), role="actor")
    b = RayWorkerGroup(pool, RayClassWithInitArgs(CriticRole, 2.0), role="reward_model")
    try:
        assert a.get()[0][2] != b.get()[0][2]  # two processes in the one bundle
        with pytest.raises(ResourceUnavailableError, match=r"already hosts 2 worker group\(s\) \['actor', 'reward_model'\]"):
            RayWorkerGroup(pool, RayClassWithInitArgs(ActorRole, 3.0), role="ref")
    finally:
        a.shutdown()
        b.shutdown()
        pool.release()
    with pytest.raises(Exception, match="was shut down"):
        a.get()


def test_pool_larger_than_cluster_says_what_was_asked_and_what_exists(ray_session):
    from hybridflow.controller import RayResourcePool

    with pytest.raises(ResourceUnavailableError, match=r"(?s)64 worker slots.*CPU: needs 64, available \d+.*Nodes:"):
        RayResourcePool([64]).get_placement_groups()
    with pytest.raises(ResourceUnavailableError, match=r"GPU: needs 1, available 0"):
        RayResourcePool([1], use_gpu=True).get_placement_groups()
