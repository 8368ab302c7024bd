"""Helpers for tests, for flakekit's own and for plugin authors (one module per concept).

The contract suites (``AllocatorContract``, ``SegmentStoreContract``) and the fixtures of
the pytest plugin (``flakekit.testing.pytest_plugin``, opt-in: ``-p
flakekit.testing.pytest_plugin``, no ``pytest11`` entry point) need pytest; the rest does not.
Process drills: ``flakekit.testing.drills``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flakekit.testing.ageing import age_rows
from flakekit.testing.clock import ManualClock
from flakekit.testing.databases import (
    free_port,
    fresh_database,
    listening,
    proxied,
    unreachable_url,
)
from flakekit.testing.events import EventRecorder
from flakekit.testing.proxy import TcpProxy
from flakekit.testing.requests import lease_request
from flakekit.testing.threads import assert_disjoint, assert_unique, in_threads
from flakekit.testing.waiting import wait_until

if TYPE_CHECKING:
    from flakekit.testing.allocator_contract import AllocatorContract
    from flakekit.testing.membership_contract import MembershipContract
    from flakekit.testing.segment_store_contract import SegmentStoreContract

__all__ = [
    "AllocatorContract", "EventRecorder", "ManualClock", "MembershipContract",
    "SegmentStoreContract", "TcpProxy",
    "age_rows", "assert_disjoint", "assert_unique", "free_port", "fresh_database",
    "in_threads", "lease_request", "listening", "proxied", "unreachable_url", "wait_until",
]

_LAZY = {  # these import pytest
    "AllocatorContract": "flakekit.testing.allocator_contract",
    "MembershipContract": "flakekit.testing.membership_contract",
    "SegmentStoreContract": "flakekit.testing.segment_store_contract",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
