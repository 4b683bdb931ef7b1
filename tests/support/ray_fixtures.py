"""Ray clusters started by the tests themselves (for tests/cluster): one node with two CPUs (``ray_local``),
the same started with the loopback S3 server's variables set (``ray_local_s3``) and a two-node
cluster (``ray_two_nodes``). Commands run as subprocesses reach them at ``.address``.

Starting a cluster takes seconds, so each kind is started once for all the modules that use it,
not once a module: a process holds one Ray session at a time, so ``_RaySessions`` keeps the one
asked for last and stops it when another kind is asked for, and ``order_by_cluster`` (called by
the conftest's collection hook) puts the modules of one kind next to each other. A test module
uses one of the three. Tests share a cluster, never what another test left in it: each writes
only under its own tmp_path, and Ray's object store holds nothing a test reads back later. Job
functions sent to Ray must be importable by its workers (functions of ``tfrfs``, or of modules
under tests/support), not defined in a test file."""

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


KINDS = ("ray_local", "ray_local_s3", "ray_two_nodes")


class _RaySessions:
    """The one live cluster of this process, of the kind asked for last."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.cluster: RayCluster | None = None
        self._stop: list = []

    def get(self, kind: str, start) -> RayCluster:
        if kind != self.kind:
            self.stop()
            self.cluster, stop = start()
            self.kind = kind
            self._stop.append(stop)
        assert self.cluster is not None
        return self.cluster

    def stop(self) -> None:
        while self._stop:
            self._stop.pop()()
        self.kind = self.cluster = None


@pytest.fixture(scope="session")
def _ray_sessions() -> Iterator[_RaySessions]:
    sessions = _RaySessions()
    try:
        yield sessions
    finally:
        sessions.stop()


def _start_local(prepare=None):
    """``ray.init(num_cpus=2)``; ``prepare(monkeypatch)`` sets the environment Ray's processes
    start with (this process gets its own back at once)."""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as mp:
        if prepare is not None:
            prepare(mp)
        # address="local": a cluster of its own, never one found on the machine (ray.init() alone
        # joins the cluster another run's `ray start` or two-node cluster left in /tmp/ray, and then
        # refuses num_cpus).
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    return RayCluster(_address(), 1), ray.shutdown


@pytest.fixture(scope="module")
def ray_local(_ray_sessions: _RaySessions) -> RayCluster:
    """``ray.init(num_cpus=2)``: a one-node cluster on this machine."""
    return _ray_sessions.get("ray_local", _start_local)


@pytest.fixture(scope="module")
def ray_two_nodes(_ray_sessions: _RaySessions) -> RayCluster:
    """A head node and a worker node (``ray.cluster_utils.Cluster``), one CPU each."""
    def start():
        ray = pytest.importorskip("ray")
        from ray.cluster_utils import Cluster
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)

        def stop() -> None:
            ray.shutdown()
            cluster.shutdown()
        return RayCluster(cluster.address, 2, cluster), stop
    return _ray_sessions.get("ray_two_nodes", start)


@pytest.fixture(scope="module")
def ray_local_s3(_ray_sessions: _RaySessions, _s3_session, _s3_proxy_session) -> Iterator[RayCluster]:
    """``ray_local`` started with the loopback S3 server's variables set (its workers inherit
    them), for commands that read or write a bucket on Ray; the module's tests see the same
    variables. The server and its proxy live for the session, so a cluster started for one
    module holds the right variables for the next."""
    from support.remote_fixtures import s3_environment

    def prepare(mp: pytest.MonkeyPatch) -> None:
        s3_environment(mp, _s3_session, _s3_proxy_session)
    with pytest.MonkeyPatch.context() as mp:
        prepare(mp)
        yield _ray_sessions.get("ray_local_s3", lambda: _start_local(prepare))


def order_by_cluster(items: list) -> None:
    """Reorders, in place, the tests that use a cluster so that the modules of one kind run one
    after another (in KINDS order; each module's tests stay together and in their order): each
    kind is then started once. They keep the places they had among the other tests, which do
    not move."""
    def kind(item) -> int:
        names = getattr(item, "fixturenames", ())
        return next((n for n, k in enumerate(KINDS) if k in names), -1)
    module_kind: dict[object, int] = {}
    for item in items:
        module = getattr(item, "module", None)
        module_kind[module] = max(module_kind.get(module, -1), kind(item))
    slots = [n for n, item in enumerate(items) if module_kind[getattr(item, "module", None)] >= 0]
    first: dict[object, int] = {}
    for n in slots:
        first.setdefault(items[n].module, n)
    moved = sorted((items[n] for n in slots), key=lambda item: (module_kind[item.module], first[item.module]))
    for n, item in zip(slots, moved):
        items[n] = item
