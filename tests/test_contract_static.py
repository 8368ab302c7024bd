"""The allocator contract against the built-in ``static`` allocator (a configured id:
not exclusive, never expires, nothing to hand to anyone else)."""

from __future__ import annotations

import pytest

from flakekit.builtin.static import StaticAllocator, StaticSettings
from flakekit.testing import AllocatorContract


class TestStaticAllocatorContract(AllocatorContract):
    exclusive = False
    reusable = False
    expires = False

    @pytest.fixture
    def make_allocator(self, closing):
        return lambda: closing(StaticAllocator(StaticSettings(worker_id=0)))
