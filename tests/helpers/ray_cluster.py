"""One local Ray cluster for the whole session, shared by the tests that need a cluster
but do not exist to start their own (a fixture plugin, registered in tests/conftest.py).

- `ray_cluster`: the session's cluster, started on first use with the engine's own
  `connect()` (127.0.0.1 only, no dashboard, OMP_NUM_THREADS=1 in every Ray process). A
  run or a code extraction in this process then finds Ray connected and uses it as it is
  (`engine.cluster.connect`: `borrowed`, so its `close()` leaves the cluster running).
- `@pytest.mark.own_cluster`: a test that starts its own cluster, in this process or in
  a child: the journey, two runs at once, the failover and CLI runs, S3 storage, the
  two-node sandboxes. The shared cluster is stopped before it, so its in-process run
  starts its own cluster and its checks of what is left running see only its own
  processes; the local-cluster settings the shared one put in this process's
  environment are gone before it starts children. These tests run after all the others
  (`pytest_collection_modifyitems`), so the shared cluster starts once per session.
- `--part own` runs the modules with an own-cluster test (and those in `OWN_PART_TOO`),
  `--part shared` all the others: `packaging/run_tests.sh` runs the two side by side, in
  two processes, so the own-cluster tests' waits (clusters starting, workers restarting)
  overlap the rest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from engine.cluster import ClusterHandle, connect

OWN_CLUSTER = "own_cluster"
#: shared-cluster modules that run in `--part own` too, before its own-cluster modules, so
#: the two processes end together (fresh-clone CI, 2 cores: own 12.4 min, shared 17.0 min
#: before these ~150 s moved); none reads a session run, which that process would make again
OWN_PART_TOO = frozenset({"test_paths.py", "test_gpu_proof.py", "test_reinforce.py"})


class SharedCluster:
    """The session's local cluster: started on demand, stopped for an own-cluster test."""

    def __init__(self) -> None:
        self.handle: ClusterHandle | None = None
        #: how many times it was started (once per session when the order holds)
        self.starts = 0

    def up(self) -> ClusterHandle:
        if self.handle is None:
            # every Ray process inherits OMP_NUM_THREADS (1, set in tests/conftest.py
            # before anything imports torch or the engine)
            # CPUs as a training run asks for them (engine.train.plan.local_cpus): at
            # least the 2 workers of a 2-worker run; the OS shares the real cores
            self.handle = connect(None, num_cpus=max(os.cpu_count() or 1, 2))
            self.starts += 1
        return self.handle

    def down(self) -> None:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            handle.close()


#: this session's shared cluster, once a test asked for it (for the terminal summary)
_session: list[SharedCluster] = []


@pytest.fixture(scope="session")
def shared_cluster() -> Iterator[SharedCluster]:
    cluster = SharedCluster()
    _session.append(cluster)
    yield cluster
    cluster.down()


@pytest.fixture
def ray_cluster(shared_cluster: SharedCluster) -> ClusterHandle:
    """The session's local Ray cluster (an `engine.cluster.ClusterHandle`), running."""
    return shared_cluster.up()


@pytest.fixture(autouse=True)
def _own_cluster_alone(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker(OWN_CLUSTER) is not None:
        request.getfixturevalue("shared_cluster").down()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{OWN_CLUSTER}: starts its own Ray cluster; runs last, with the "
                   "session's shared cluster stopped (tests/helpers/ray_cluster.py)")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--part", choices=("all", "shared", "own"), default="all",
                     help="all tests; only the modules with an own_cluster test (own); or "
                          "all the others (shared)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A module with an own_cluster test goes last as a whole, in its order: split in two,
    # its module-scoped fixtures would be set up twice (a second S3 server on a new port
    # while clients cached by the first run still name the old one).
    last = {i.module for i in items if i.get_closest_marker(OWN_CLUSTER) is not None}
    shared = [i for i in items if i.module not in last]
    own = [i for i in items if i.module in last]
    part = config.getoption("--part")
    too = [i for i in shared if i.path.name in OWN_PART_TOO]
    keep = {"all": shared + own, "shared": [i for i in shared if i.path.name not in OWN_PART_TOO],
            "own": too + own}[part]
    kept = {id(i) for i in keep}
    dropped = [i for i in items if id(i) not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _session and _session[0].starts:
        terminalreporter.write_line(f"shared Ray cluster: started {_session[0].starts} "
                                    "time(s) (tests/helpers/ray_cluster.py)")
