"""A process that joins node ``n1`` of a cluster at a given instant, for the contract's race
of processes (``MembershipContract.test_processes_joining_one_node_at_once_admit_one``)::

    python -m flakekit.testing.membership_joiner FACTORY ARGS KWARGS CLUSTER START_AT

``FACTORY`` (``module:name``) is called with ``*ARGS, clock, **KWARGS`` (JSON) to make the
membership; it connects (reads the view) before ``START_AT`` (``time.time()``), joins
then, prints ``JOINED <incarnation>`` or ``REFUSED <error type> <message>`` (one line,
newlines as ``|``), and holds the lease until its stdin closes.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from typing import Any

from flakekit.cluster.store_contracts import JoinRequest
from flakekit.values.clock import MonotonicClock
from flakekit.values.cluster import Member

__all__ = ["main", "sql_membership"]


def sql_membership(url: str, clock: Any, **kwargs: Any) -> Any:
    """An SqlMembership on an engine of its own for ``url`` (a factory by URL)."""
    from sqlalchemy import create_engine

    from flakekit.sql.membership import SqlMembership

    return SqlMembership(create_engine(url), clock, **kwargs)


def main(argv: list[str]) -> int:
    factory, args, kwargs, cluster, start_at = argv
    module, _, name = factory.partition(":")
    make = getattr(importlib.import_module(module), name)
    membership = make(*json.loads(args), MonotonicClock(), **json.loads(kwargs))
    membership.view(cluster)                 # connected before the start line
    time.sleep(max(0.0, float(start_at) - time.time()))
    try:
        lease = membership.acquire(JoinRequest(cluster, Member("n1", "http://x:1"), 4.0))
        print("JOINED", lease.epoch, flush=True)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        print("REFUSED", type(exc).__name__, str(exc).replace("\n", "|"), flush=True)
    sys.stdin.read()                         # hold the lease until the test is done
    membership.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
