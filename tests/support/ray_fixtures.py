"""Ray clusters started by the tests themselves (for tests/cluster): one node with two CPUs (``ray_local``) and a
two-node cluster (``ray_two_nodes``). Each is started once per test module and stopped after it.
Commands run as subprocesses reach them at ``.address``. A test module uses one of the two: a
process holds one Ray session at a time. Job functions sent to Ray must be importable by its
workers (functions of ``tfrfs``, or of modules under tests/support), not defined in a test file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import pytest

# Quiet, and no usage reporting or dashboard on a test machine.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@dataclass
class RayCluster:
    address: str     # what ``--ray ADDRESS`` and ``RAY_ADDRESS`` take
    nodes: int
    handle: object = None   # ray.cluster_utils.Cluster, for the two-node cluster

    def env(self) -> dict[str, str]:
        """The environment in which a command's ``--ray`` (auto) finds this cluster."""
        return dict(os.environ, RAY_ADDRESS=self.address)


def _address() -> str:
    import ray
    return ray.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def ray_local() -> Iterator[RayCluster]:
    """``ray.init(num_cpus=2)``: a one-node cluster on this machine."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield RayCluster(_address(), 1)
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_two_nodes() -> Iterator[RayCluster]:
    """A head node and a worker node (``ray.cluster_utils.Cluster``), one CPU each."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield RayCluster(cluster.address, 2, cluster)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def ray_local_s3(_s3_session, _s3_proxy_session) -> Iterator[RayCluster]:
    """``ray_local`` started with the loopback S3 server's variables set (its workers inherit
    them), for commands that read or write a bucket on Ray."""
    from support.remote_fixtures import s3_environment
    with pytest.MonkeyPatch.context() as mp:
        s3_environment(mp, _s3_session, _s3_proxy_session)
        ray = pytest.importorskip("ray")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield RayCluster(_address(), 1)
        finally:
            ray.shutdown()
