"""The allocator contract against the ``etcd`` allocator on a real etcd (quarantine 0,
so a released id is free at once).

``expire`` is not bound: etcd keeps no time, so after a lease ends behind its holder's
back the successor waits ``lease + quarantine`` on its own clock from when it first saw
the claim gone, and the contract's test takes the id at once. test_etcd_lease.py's
``test_revoked_lease_*`` drills that case with the wait.
"""

from __future__ import annotations

from etcdhelpers import allocator

from flakekit.testing.contract_ports import PortedAllocatorContract


class TestEtcdContract(PortedAllocatorContract):
    build = staticmethod(allocator)
    settings = {"quarantine": "0s", "ttl": "4s"}
