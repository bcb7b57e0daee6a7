"""The local backend and the pure pieces of the dispatch machinery (no Ray, milliseconds)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from hybridflow.controller import (
    ClassWithInitArgs,
    Dispatch,
    Execute,
    LocalResourcePool,
    LocalWorkerGroup,
    Worker,
    WorkerError,
    create_colocated_worker_cls,
    create_resource_pool,
    create_worker_group,
    get_dispatch_mode,
    register,
    register_dispatch_mode,
)
from hybridflow.controller.decorator import concat_collect, drop_padding, validate_dispatch_info
from hybridflow.protocol import DataProto, DataProtoFuture, FutureChunk


def _rows(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n, dtype=torch.float32)}, {"tag": [f"r{i}" for i in range(n)]})


class Counter(Worker):
    def __init__(self, start: int = 0):
        super().__init__()
        self.count = start

    @register(Dispatch.ONE_TO_ALL)
    def bump(self, by: int = 1) -> int:
        self.count += by
        return self.count

    @register(Dispatch.DP_COMPUTE_PROTO)
    def plus_one(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": data.batch["x"] + 1})

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def plus_one_async(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] + 1})

    @register(Dispatch.RANK_ZERO)
    def where(self) -> tuple:
        return self.rank, self.world_size, str(self.device)

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def fail(self, msg: str):
        raise ValueError(msg)

    @register(Dispatch.ONE_TO_ALL)
    def mesh(self):
        mesh = self.get_device_mesh(("dp", "sp"), (1, 1))
        return mesh.mesh_dim_names, tuple(mesh.shape)


def test_local_group_mirrors_registered_methods_and_keeps_state():
    wg = create_worker_group("local", create_resource_pool("local", [1]), ClassWithInitArgs(Counter, start=10))
    assert isinstance(wg, LocalWorkerGroup)
    assert wg.method_names == ["bump", "fail", "mesh", "plus_one", "plus_one_async", "where"]
    assert wg.bump() == [11]
    assert wg.bump(by=5) == [16]
    assert wg.worker.count == 16  # the worker object is right here, inspectable
    assert wg.where() == (0, 1, "cpu")
    assert wg.plus_one(_rows(3)).batch["y"].tolist() == [1.0, 2.0, 3.0]


def test_local_non_blocking_returns_a_future_that_chains():
    wg = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(Counter))
    fut = wg.plus_one_async(_rows(4))
    assert isinstance(fut, DataProtoFuture)
    out = wg.plus_one(fut)  # a future goes straight into the next call
    assert out.batch["y"].tolist() == [2.0, 3.0, 4.0, 5.0]
    assert fut.get().batch["x"].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_local_error_names_class_method_rank_and_keeps_cause():
    wg = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(Counter), role="critic")
    with pytest.raises(WorkerError) as ei:
        wg.fail("planned failure 42")
    err = ei.value
    assert (err.role, err.worker_class, err.method, err.rank) == ("critic", "Counter", "fail", 0)
    assert "planned failure 42" in err.remote_traceback and "raise ValueError(msg)" in err.remote_traceback
    assert isinstance(err.__cause__, ValueError)


def test_local_constructor_error_is_a_worker_error():
    class Broken(Worker):
        def __init__(self):
            super().__init__()
            raise RuntimeError("no model here")

    with pytest.raises(WorkerError, match=r"(?s)Broken.__init__ failed on rank 0.*no model here"):
        LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(Broken))


def test_local_pool_rejects_more_than_one_rank():
    with pytest.raises(ValueError, match="trainer.backend=ray"):
        create_resource_pool("local", [2])
    with pytest.raises(KeyError, match="Did you mean 'local'"):
        create_resource_pool("locl", [1])


def test_device_mesh_and_process_group_in_world_of_one():
    wg = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(Counter))
    assert wg.mesh() == [(("dp", "sp"), (1, 1))]
    import torch.distributed as dist

    assert dist.is_initialized() and dist.get_backend() == "gloo" and dist.get_world_size() == 1
    with pytest.raises(ValueError, match=r"must multiply to the world size 1"):
        wg.worker.get_device_mesh(("dp", "tp"), (2, 1))


class Actor(Worker):
    def __init__(self, lr: float):
        super().__init__()
        self.lr = lr

    @register(Dispatch.ONE_TO_ALL)
    def state(self):
        return "actor", self.lr, os.getpid()


class Critic(Worker):
    def __init__(self, lr: float):
        super().__init__()
        self.lr = lr

    @register(Dispatch.ONE_TO_ALL)
    def state(self):
        return "critic", self.lr, os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def set_lr(self, lr: float):
        self.lr = lr


def test_local_colocation_gives_one_view_per_role():
    host = create_colocated_worker_cls({"actor": ClassWithInitArgs(Actor, lr=1.0), "critic": ClassWithInitArgs(Critic, 2.0)})
    wg = LocalWorkerGroup(LocalResourcePool(), host)
    views = wg.spawn(["actor", "critic"])
    assert views["actor"].method_names == ["state"]
    assert views["critic"].method_names == ["set_lr", "state"]
    views["critic"].set_lr(5.0)
    assert views["actor"].state() == [("actor", 1.0, os.getpid())]
    assert views["critic"].state() == [("critic", 5.0, os.getpid())]
    with pytest.raises(KeyError, match="roles: \\['actor', 'critic'\\]"):
        wg.spawn(["ref"])
    with pytest.raises(TypeError, match="needs a colocated worker group"):
        LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(Actor, lr=1.0)).spawn(["actor"])


# ------------------------------------------------------------------------------- pure pieces
def test_future_chunk_padding_golden():
    # 5 rows in 4 chunks: padded to 8 with rows 0,1,2 again -> chunks [0,1] [2,3] [4,0] [1,2]
    data = _rows(5)
    parts = [FutureChunk(i, 4, auto_pad=True).select(data) for i in range(4)]
    assert [p.batch["x"].tolist() for p, _ in parts] == [[0, 1], [2, 3], [4, 0], [1, 2]]
    assert [pad for _, pad in parts] == [0, 0, 1, 2]
    assert FutureChunk(1, 2)(_rows(4)).batch["x"].tolist() == [2, 3]
    with pytest.raises(Exception, match="pad_to_divisor"):
        FutureChunk(0, 3)(_rows(4))


def test_concat_collect_picks_ranks_and_unpads():
    outs = [DataProto.from_dict({"x": torch.tensor([float(r), float(r)])}) for r in range(4)]
    assert concat_collect(outs, ranks=[0, 2], pad_size=1, padded_len=4).batch["x"].tolist() == [0.0, 0.0, 2.0]
    # 2 output rows per input row (e.g. rollout.n=2): 1 padded input row -> its 2 outputs dropped
    assert concat_collect(outs, pad_size=1, padded_len=4).batch["x"].tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="7 output rows for 4 padded input rows"):
        drop_padding(_rows(7), 1, 4)
    with pytest.raises(TypeError, match="rank 1 returned int"):
        concat_collect([outs[0], 3])


def test_validate_dispatch_info_errors():
    validate_dispatch_info("actor", [(0, True), (0, False), (1, True), (1, False)])
    with pytest.raises(ValueError, match="dp rank 1 has 2 collect ranks"):
        validate_dispatch_info("actor", [(0, True), (1, True), (1, True)])
    with pytest.raises(ValueError, match="dp ranks must be 0..1"):
        validate_dispatch_info("actor", [(0, True), (2, True)])


def test_register_rejects_bad_modes():
    with pytest.raises(KeyError, match="Unknown dispatch mode 'DP_COMPUTE_PROTOO'. Did you mean 'DP_COMPUTE_PROTO'"):
        get_dispatch_mode("DP_COMPUTE_PROTOO")
    with pytest.raises(TypeError, match="execute_mode must be an Execute member"):
        register(Dispatch.ONE_TO_ALL, execute_mode="all")

    class Typo(Worker):
        @register("NO_SUCH_MODE")
        def f(self):
            return 1

    with pytest.raises(KeyError, match="Unknown dispatch mode 'NO_SUCH_MODE'"):
        LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(Typo))


def test_proto_mode_rejects_plain_arguments_with_a_fix():
    wg = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(Counter))
    with pytest.raises(TypeError, match=r"positional argument 0 is a int.*meta_info"):
        wg.plus_one(3)


def _pairs_dispatch(group, items):
    # user mode: consecutive pairs of a list go to consecutive ranks
    n = group.world_size
    return ([[items[2 * r : 2 * r + 2] for r in range(n)]], {})


def _flatten_collect(group, outputs):
    return [x for out in outputs for x in out]


register_dispatch_mode("TEST_LOCAL_PAIRS", _pairs_dispatch, _flatten_collect)


class PairWorker(Worker):
    @register("TEST_LOCAL_PAIRS")
    def neg(self, items):
        return [-x for x in items]


def test_user_registered_mode_runs_locally():
    wg = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(PairWorker))
    assert wg.neg([1, 2, 3]) == [-1, -2]  # world size 1: rank 0 gets the first pair
    with pytest.raises(ValueError, match="already registered"):
        register_dispatch_mode("TEST_LOCAL_PAIRS", _flatten_collect, _flatten_collect)


def test_non_tensor_columns_survive_dispatch():
    class Tagger(Worker):
        @register(Dispatch.DP_COMPUTE_PROTO)
        def tag(self, data):
            return DataProto.from_dict(non_tensors={"t": np.array([s.upper() for s in data.non_tensor_batch["tag"]], dtype=object)})

    wg = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(Tagger))
    assert list(wg.tag(_rows(2)).non_tensor_batch["t"]) == ["R0", "R1"]
