"""A process already connected to Ray (a notebook, the test session) lends its cluster to
the engine: `connect()` uses it as it is, and the handle's `close()` leaves it running, so
the next run, or whoever started it, still has it."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.slow
def test_connect_borrows_a_running_cluster_and_close_leaves_it(ray_cluster: Any) -> None:
    import ray

    from engine.cluster import connect

    with connect(None, num_cpus=1) as handle:
        # asked for a new local cluster of 1 CPU: the running one is used, as it is
        assert handle.borrowed and not handle.started_here
        assert handle.num_cpus == ray_cluster.num_cpus >= 2
    assert ray.is_initialized()
    assert ray.get(ray.remote(lambda: 2).remote()) == 2  # and it still runs work
