"""Every drill of test_cluster_drills.py again, on nodes of two processes each (``serve
--workers 2`` with ``[cluster]``: each process a member ``NODE.i`` on a private port of
its own, docs/server.md). The drills are imported, not copied; only the cluster they run
on differs. A drill's "node" is all of its processes: a pause, a kill or a store cut hits
both, a drain moves both members, and the owner is the node one of whose members owns the
key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cluster_testing import Cluster
from test_cluster_drills import *  # noqa: F403 - the drills, collected here again
from test_cluster_drills import drill_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three ``serve --workers 2`` nodes: six members."""
    yield from drill_cluster(tmp_path_factory, workers=2)
