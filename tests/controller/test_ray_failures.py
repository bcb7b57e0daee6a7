"""Failures across processes: they surface in the controller named (role, class, method, rank), fast.

A worker that dies must be reported within seconds even while its peers block, never as a hang.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from hybridflow.controller import Dispatch, NodeLostError, Worker, WorkerDiedError, WorkerError, register
from hybridflow.protocol import DataProto

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


class FaultWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def exit_on(self, rank: int, others_wait_s: float):
        if self.rank == rank:
            os._exit(3)  # a hard crash: no exception, no cleanup
        time.sleep(others_wait_s)  # the peers stay busy, like ranks blocked in a collective
        return self.rank

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def fail_async(self, data: DataProto) -> DataProto:
        if self.rank == 1:
            raise KeyError("missing column 'responses'")
        return data


class BrokenInit(Worker):
    def __init__(self):
        super().__init__()
        raise FileNotFoundError("/no/such/model")

    @register(Dispatch.ONE_TO_ALL)
    def noop(self):
        return None


@pytest.fixture(scope="module")
def ray_session():
    from hybridflow.controller import init_ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    init_ray({"num_cpus": 4, "include_dashboard": False})
    yield
    ray.shutdown()


def test_constructor_failure_names_init_and_rank(ray_session):
    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool([1])
    with pytest.raises(WorkerError) as ei:
        RayWorkerGroup(pool, RayClassWithInitArgs(BrokenInit), role="reward_model")
    err = ei.value
    assert (err.role, err.worker_class, err.method, err.rank) == ("reward_model", "BrokenInit", "__init__", 0)
    assert "FileNotFoundError: /no/such/model" in err.remote_traceback
    pool.release()


def test_errors_deaths_and_kills_are_reported_within_seconds(ray_session):
    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool([2])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(FaultWorker), role="critic", poll_interval_s=0.5)
    try:
        # 1. a failing non-blocking call: the future raises a named error when resolved
        fut = wg.fail_async(DataProto.from_dict({"x": torch.arange(4)}))
        with pytest.raises(WorkerError) as ei:
            fut.get()
        assert (ei.value.role, ei.value.method, ei.value.rank) == ("critic", "fail_async", 1)
        assert "missing column 'responses'" in ei.value.remote_traceback

        # 2. rank 1 crashes while rank 0 stays busy for an hour: the death is reported without waiting for rank 0
        # (were it not, this call would block until pytest's timeout fails the test), naming rank 1
        with pytest.raises(WorkerDiedError) as ei:
            wg.exit_on(1, others_wait_s=3600.0)
        assert (ei.value.role, ei.value.worker_class, ei.value.method, ei.value.rank) == ("critic", "FaultWorker", "exit_on", 1)
        assert "rank 1" in str(ei.value) and "'critic'" in str(ei.value)
        assert not isinstance(ei.value, NodeLostError)  # its node's raylet still answers: the worker died alone

        # 3. rank 0 is killed from outside (OOM killer, ray.kill): the next call fails fast, naming rank 0
        ray.kill(wg.workers[0], no_restart=True)
        with pytest.raises(WorkerDiedError) as ei:
            wg.execute_rank_zero("pid")  # rank 1 is gone too (step 2); ask rank 0 alone
        assert (ei.value.rank, ei.value.method) == (0, "pid")
    finally:
        wg.shutdown()
        pool.release()
