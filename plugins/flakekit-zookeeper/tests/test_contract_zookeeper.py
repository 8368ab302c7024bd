"""The allocator contract against the ``zookeeper`` allocator on a real ZooKeeper.

Lease mode keeps the whole contract (quarantine 0, so a released id is free at once).
Leaf mode owns each id for good per ip:port (Leaf's persistent sequential nodes), so the
"a released id is taken again" promises do not apply; the rest does. Ending a session
behind its holder's back (``expire``) is left to the drills (test_zk_lease.py,
test_zk_blips.py): a session outlives its holder by seconds, not on a test's command.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from zkhelpers import allocator

from flakekit.testing import AllocatorContract
from flakekit.testing.contract_ports import PortedAllocatorContract


class TestZooKeeperLeaseContract(PortedAllocatorContract):
    build = staticmethod(allocator)
    settings = {"mode": "lease", "quarantine": "0s"}


class TestZooKeeperLeafContract(AllocatorContract):
    """Leaf mode's renewals hand out the deadline its reporter's last report kept, so
    ``pass_time`` reports (as the background reporter would)."""

    reusable = False  # Leaf: an ip:port owns its id for good

    @pytest.fixture
    def made(self) -> list[Any]:
        return []

    @pytest.fixture
    def pass_time(self, made):
        def pass_time(seconds: float) -> None:
            time.sleep(seconds)
            for alloc in made:
                alloc.report()

        return pass_time

    @pytest.fixture
    def make_allocator(self, ns, tmp_path, made, closing):
        def make() -> Any:
            made.append(closing(allocator(ns, mode="leaf", cache_dir=str(tmp_path / "cache"),
                                          ip="10.9.8.7", port=9000 + len(made))))
            return made[-1]

        return make
