"""The allocator contract for allocators whose identity is their ip:port (etcd,
ZooKeeper, Redis): each allocator the contract makes gets a port of its own, as each live
process would, and is closed after the test. A binding whose allocator is built from the
test's ``ns`` fixture only names its builder and settings::

    class TestEtcdContract(PortedAllocatorContract):
        build = staticmethod(allocator)   # allocator(ns, port=..., **settings)
        settings = {"quarantine": "0s", "ttl": "4s"}

Others write ``make_allocator`` with :func:`on_own_ports`. Needs pytest.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

import pytest

from flakekit.testing.allocator_contract import AllocatorContract

__all__ = ["PortedAllocatorContract", "on_own_ports"]


def on_own_ports(closing: Callable[[Any], Any], build: Callable[..., Any],
                 first: int = 8080) -> Callable[[], Any]:
    """A maker calling ``build(port=...)`` with ``first``, ``first + 1``, ... and handing
    each allocator to ``closing`` (the pytest plugin's fixture)."""
    ports = itertools.count(first)
    return lambda: closing(build(port=next(ports)))


class PortedAllocatorContract(AllocatorContract):
    """The contract over ``build(ns, port=..., **settings)``, one port per allocator."""

    build: Callable[..., Any]
    settings: ClassVar[dict[str, Any]] = {}

    @pytest.fixture
    def make_allocator(self, ns: str, closing: Callable[[Any], Any]) -> Callable[[], Any]:
        return on_own_ports(closing, partial(self.build, ns, **self.settings))
