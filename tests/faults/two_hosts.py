"""A Ray cluster over the two hosts of a :class:`~netns.NetnsPair` (test helper).

The head node runs in namespace A, the worker node in namespace B, each started with the ``ray`` CLI as in
``tests/ray_cli_cluster.py`` (``ray start --block``, token authentication, a temp dir and ports of its own, a
custom resource ``hf_head`` / ``hf_worker``) but advertising its veth address (``--node-ip-address``), so the
two nodes talk over the veth pair only.  A driver runs on a host with :meth:`TwoHostRayCluster.driver_argv`.
"""

from __future__ import annotations

from ray_cli_cluster import RayCliCluster

from .netns import NetnsPair

HOST_OF = {"head": "A", "worker": "B", "head2": "A"}


class TwoHostRayCluster(RayCliCluster):
    """``head`` on host A with ``cpus["head"]`` CPUs, ``worker`` on host B with ``cpus["worker"]``."""

    def __init__(self, pair: NetnsPair, cpus: dict[str, int], start_timeout_s: float = 180.0):
        super().__init__(num_cpus=max(cpus.values()), start_timeout_s=start_timeout_s)
        self.pair = pair
        self.cpus = dict(cpus)
        self.address = f"{self.node_ip('head')}:{self.gcs_port}"

    def node_ip(self, name: str) -> str:
        return self.pair.hosts[HOST_OF[name]].ip

    def node_cpus(self, name: str) -> int:
        return self.cpus[name]

    def wrap(self, name: str, argv: list[str]) -> list[str]:
        return self.pair.exec_argv(HOST_OF[name], argv)

    def add_node_on_a(self, cpus: int) -> None:
        """A second Ray node on host A (``head2``, ``cpus`` CPUs, resource ``hf_head2``): more of host A's capacity
        given to the cluster, e.g. after host B is lost."""
        self.cpus["head2"] = cpus
        self._start("head2", [f"--address={self.address}"], self.ports.block())
        self._wait(lambda nodes: any("hf_head2" in n["resources"] for n in nodes), "the second node on host A",
                   lost=("worker",))

    def driver_argv(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run on ``host`` ("A" or "B"), e.g. a ``hybridflow train`` that attaches to this cluster."""
        return self.pair.exec_argv(host, argv)
