"""Two simulated Ray nodes on this machine (``ray.cluster_utils.Cluster``): one pool spanning both,
ranks on each node forming one gloo group that all-reduces, torchrun-style local ranks per node."""

from __future__ import annotations

import sys

import pytest
import torch

from hybridflow.controller import Dispatch, Worker, register

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]


class NodeWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def place_and_reduce(self, value: float):
        import torch.distributed as dist

        self.init_distributed()
        t = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(t)
        info = self._get_process_info()
        return info["node_id"], self.rank, self.local_rank, self.local_world_size, float(t.item())


@pytest.fixture(scope="module")
def two_node_cluster():
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # 1 CPU per node: each per-node placement group (STRICT_PACK, 1 CPU) can only fit on its own node
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    from hybridflow.controller import init_ray

    init_ray({"address": cluster.address})
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_pool_spans_two_nodes_and_all_reduces(two_node_cluster, capfd):
    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, ResourceUnavailableError

    with pytest.raises(ResourceUnavailableError, match="2 workers must share one node"):
        RayResourcePool([2]).get_placement_groups()  # 2 CPUs exist in total, but never on one node

    pool = RayResourcePool([1, 1])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(NodeWorker), role="actor")
    try:
        out = wg.place_and_reduce(1.0)
        nodes = [o[0] for o in out]
        assert len(set(nodes)) == 2, f"both ranks landed on one node: {nodes}"
        assert {n["NodeID"] for n in ray.nodes() if n["Alive"]} == set(nodes)
        assert [node for node, _ in wg.placement] == nodes  # what the group reports is where the ranks run
        assert [o[1:4] for o in out] == [(0, 0, 1), (1, 0, 1)]  # each node: local rank 0 of 1
        assert [o[4] for o in out] == [3.0, 3.0]  # 1 + 2 across the two nodes
        said = capfd.readouterr().err
        assert f"actor ranks: rank 0 on node {nodes[0][:8]}" in said and f"rank 1 on node {nodes[1][:8]}" in said
    finally:
        wg.shutdown()
        pool.release()
