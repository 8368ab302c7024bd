"""The server asks a generator what it is (``Kit.describe``), never switches on the names
of strategies or allocators: a plugin's allocator that pins the worker id is refused with
several processes like ``static``, and a plugin's strategy is served as "other"."""

from __future__ import annotations

import itertools

import attrs
import pytest
from flakekit_server.app import ServerOptions, describe
from flakekit_server.runner import check_config

from flakekit import hookimpl
from flakekit.plugin import ConfigError, WorkerLease, build_kit, get_host


@attrs.frozen
class NoSettings:
    pass


class PinnedAllocator:
    """Worker id 5 for every process, and it says so (FixedWorker)."""

    renew_interval = None
    fixed_worker = True

    def acquire(self, request):
        return WorkerLease(worker_id=5)

    def renew(self, lease, issued_until_ns):
        return lease

    def release(self, lease, issued_until_ns):
        pass

    def records(self):
        return []

    def close(self):
        pass


@attrs.define
class Tally:
    _count: itertools.count = attrs.Factory(lambda: itertools.count(1))

    def start(self):
        return self

    def next_id(self):
        return next(self._count)

    def next_ids(self, n):
        return [next(self._count) for _ in range(n)]

    def close(self):
        pass


class CapabilityPlugin:
    @hookimpl
    def flakekit_register_allocators(self, register):
        register("pinned", lambda settings, ctx: PinnedAllocator(), settings=NoSettings)

    @hookimpl
    def flakekit_register_strategies(self, register):
        register("tally", lambda settings, ctx: Tally(), settings=NoSettings)


@pytest.fixture
def plugin_host():
    host = get_host()
    host.register(CapabilityPlugin(), name="undo-capabilities")
    try:
        yield host
    finally:
        host.unregister("undo-capabilities")


def _config(tmp_path, text):
    path = tmp_path / "flakekit.toml"
    path.write_text(text, encoding="utf-8")
    from flakekit.plugin import load_config

    return load_config(path)


def test_fixed_worker_allocator_refused_with_several_processes(plugin_host, tmp_path):
    """A plugin allocator declaring fixed_worker is refused for --workers 2, by its field."""
    config = _config(tmp_path, '[generators.g]\nallocator = { type = "pinned" }\n')
    check_config(config, ServerOptions(workers=1))
    with pytest.raises(ConfigError, match=r"^generators\.g\.allocator: a 'pinned' allocator "
                                          r"gives every process the same worker id"):
        check_config(config, ServerOptions(workers=2))


def test_plugin_strategy_is_described_by_capabilities(plugin_host, tmp_path):
    """A strategy with neither layout nor key is 'other', ready, and no snowflake default."""
    config = _config(tmp_path, '[generators.t]\nstrategy = "tally"\n')
    kit = build_kit(config, plugin_host)
    try:
        what = kit.describe("t")
        assert (what.strategy, what.layout, what.key, what.allocator) == ("tally", None, None, None)
        assert describe("t", what, None) == {"name": "t", "strategy": "tally", "kind": "other",
                                             "ready": True, "problem": None}
    finally:
        kit.close()
    with pytest.raises(ConfigError, match="unknown snowflake generator 't'"):
        check_config(config, ServerOptions(snowflake_default="t"))
