"""Every drill of test_cluster_drills.py again, on nodes of two processes each (``serve
--workers 2`` with ``[cluster]``: each process a member ``NODE.i`` on a private port of
its own, docs/server.md). The drills are imported, not copied; only the cluster they run
on differs. A drill's "node" is all of its processes: a pause, a kill or a store cut hits
both, a drain moves both members, and the owner is the node one of whose members owns the
key.

The single-process module is the default-settings drill of each property (lease 10 s,
statement_timeout 30 s); these run on a lease of 5 s and a statement_timeout of 10 s
(reply limit 15 s): every margin of a drill is a share of the lease or reply limit
(``cluster.lease_s``, ``cluster.reply_s``), so halving them keeps the margins and halves
the waits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cluster_testing import Cluster
from test_cluster_drills import *  # noqa: F403 - the drills, collected here again
from test_cluster_drills import drill_cluster

LEASE_S = 5.0                # half the default lease
STATEMENT_TIMEOUT_S = 10.0   # a reply limit of 15 s (the default: 35 s)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three ``serve --workers 2`` nodes: six members, on the short lease."""
    yield from drill_cluster(tmp_path_factory, workers=2, lease_s=LEASE_S,
                             statement_timeout_s=STATEMENT_TIMEOUT_S)
