"""The registration hooks no other test implemented: a clock and a segment store from an
in-process plugin, used by name from a config (tests/test_hooks_meta.py asks every hook for
a test like these)."""

from __future__ import annotations

import datetime as dt
import time

import attrs
import pytest
from sqlalchemy import create_engine

from flakekit.assembly.config import parse_config
from flakekit.assembly.kit import build_kit
from flakekit.errors import ConfigError
from flakekit.pluginhost.host import PluginHost
from flakekit.pluginhost.markers import hookimpl
from flakekit.sql.leaf import SqlSegmentStore
from flakekit.sql.settings import SqlStoreSettings
from flakekit.values.clock import MonotonicClock

HOUR_MS = 3_600_000


@attrs.frozen
class AheadSettings:
    ahead_ms: int = attrs.field(default=0, validator=attrs.validators.instance_of(int))


def ahead_clock(ahead_ms: int) -> MonotonicClock:
    """Monotonic wall time ``ahead_ms`` in the future (a fixed offset: read once per ID)."""
    offset_ns = time.time_ns() - time.monotonic_ns() + ahead_ms * 1_000_000
    return MonotonicClock(name="ahead", offset_ns=offset_ns)


class ClockPlugin:
    @hookimpl
    def flakekit_register_clocks(self, register):
        register("ahead", lambda s: ahead_clock(s.ahead_ms), settings=AheadSettings,
                 description="wall time shifted by ahead_ms")


class StorePlugin:
    """Registers the built-in leaf_alloc store a second time under another name: the hook
    path (name → factory → settings → store) with a real store behind it."""

    @hookimpl
    def flakekit_register_segment_stores(self, register):
        register("leaf-copy", SqlSegmentStore.from_settings, settings=SqlStoreSettings,
                 description="leaf_alloc, registered by a plugin")


def _host(plugin: object) -> PluginHost:
    return PluginHost().load(entrypoints=False, extra=[plugin])


def test_registered_clock_stamps_the_ids():
    """``clock = {type = "ahead", ...}`` builds the plugin's clock with its settings; the
    IDs carry its time (an hour ahead), not the system clock's."""
    config = parse_config({"generators": {"g": {
        "clock": {"type": "ahead", "ahead_ms": HOUR_MS},
        "allocator": {"type": "static", "worker_id": 3},
    }}})
    kit = build_kit(config, _host(ClockPlugin()))
    with kit:
        gen = kit["g"]
        issued = gen.next_id()
    ahead = gen.layout.timestamp(issued) - dt.datetime.now(dt.UTC)
    assert dt.timedelta(minutes=30) < ahead < dt.timedelta(minutes=90)
    assert gen.layout.decompose(issued)["worker"] == 3


def test_registered_clock_settings_are_checked():
    """A key the plugin's settings do not have is named with its config path."""
    config = parse_config({"generators": {"g": {
        "clock": {"type": "ahead", "ahed_ms": 1},
        "allocator": {"type": "static", "worker_id": 3},
    }}})
    with pytest.raises(ConfigError, match=r"generators\.g\.clock\.ahed_ms"):
        build_kit(config, _host(ClockPlugin()))


def test_registered_segment_store_serves_ranges(sqlite_url):
    """``store = {type = "leaf-copy", ...}`` reaches the plugin's factory with its settings
    and the generator hands out the key's IDs from it."""
    SqlSegmentStore(create_engine(sqlite_url)).create("invoice", 10)
    config = parse_config({
        "backends": {"main": {"url": sqlite_url}},
        "generators": {"invoices": {
            "strategy": "segment", "key": "invoice",
            "store": {"type": "leaf-copy", "backend": "main"},
        }},
    })
    with build_kit(config, _host(StorePlugin())) as kit:
        assert kit["invoices"].next_id() == 1
        assert list(kit["invoices"].next_ids(3)) == [2, 3, 4]


# -- flakekit_operation -------------------------------------------------------------------------
class OperationRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int, dict, str | None]] = []

    @hookimpl
    def flakekit_operation(self, operation, generator, duration_ns, attributes, error):
        self.calls.append((operation, generator, duration_ns, attributes, error))


def test_operation_hook_gets_segment_fetches_and_lease_renewals(sqlite_url):
    """Each segment fetch and lease renewal reaches ``flakekit_operation`` with its
    duration and what it was about; a lost renewal with the reason."""
    SqlSegmentStore(create_engine(sqlite_url)).create("invoice", 10)
    recorder = OperationRecorder()
    config = parse_config({
        "backends": {"main": {"url": sqlite_url}},
        "generators": {
            "invoices": {"strategy": "segment", "key": "invoice", "store": {"backend": "main"}},
            "orders": {"strategy": "snowflake",
                       "allocator": {"type": "sql", "backend": "main", "heartbeat": "30m"}},
        },
    })
    with build_kit(config, _host(recorder)) as kit:
        assert list(kit["invoices"].next_ids(3)) == [1, 2, 3]
        assert kit["orders"].keeper.renew_once()
        engine = create_engine(sqlite_url)
        with engine.begin() as conn:   # the row taken by another holder: the next renewal loses
            conn.exec_driver_sql("UPDATE system_nodes SET version = version + 1, holder = 'x'")
        engine.dispose()
        assert not kit["orders"].keeper.renew_once()
    fetch = next(c for c in recorder.calls if c[0] == "segment.fetch")
    assert fetch[1] == "invoices" and fetch[3]["key"] == "invoice" and fetch[3]["max_id"] == 11
    assert fetch[2] > 0 and fetch[4] is None
    renewals = [c for c in recorder.calls if c[0] == "lease.renew"]
    assert [r[4] is None for r in renewals] == [True, False]
    assert renewals[0][1] == "orders" and "worker 0" in renewals[0][3]["subject"]
    assert "no longer ours" in renewals[1][4]


# -- flakekit_register_memberships -------------------------------------------------------------
@attrs.frozen
class CopySettings:
    backend: str = "default"


class MembershipPlugin:
    """Registers the built-in SQL membership a second time under another name: config →
    hook → factory(settings, context) → a Membership with a real database behind it."""

    @hookimpl
    def flakekit_register_memberships(self, register):
        from flakekit.sql.membership import SqlMembership

        def build(settings, ctx):
            engine = ctx.backends.engine(settings.backend, f"{ctx.path}.backend")
            return SqlMembership(engine, ctx.clock, create_schema=True)

        register("sql-copy", build, settings=CopySettings,
                 description="the SQL membership, registered by a plugin")


def _cluster_config(url, membership, **cluster):
    return parse_config({
        "backends": {"main": {"url": url}},
        "cluster": {"name": "ids", "advertise": "http://127.0.0.1:8001", "node": "web-1",
                    "membership": membership, **cluster},
        "generators": {"orders": {"strategy": "segment", "order": "strict",
                                  "store": {"backend": "main"}}},
    })


def test_registered_membership_is_built_from_config(sqlite_url):
    """``membership = {type = "sql-copy", ...}`` reaches the plugin's factory with its
    settings at ``cluster.membership``; the kit's membership is what it returned and works
    against the database (a join, a view)."""
    from flakekit.cluster.store_contracts import JoinRequest
    from flakekit.values.cluster import Member

    host = _host(MembershipPlugin())
    listed = {p.name: p.registers for p in host.plugins()}
    assert "membership:sql" in listed["flakekit.builtin.cluster"]
    assert any(regs == ("membership:sql-copy",) for regs in listed.values())
    kit = build_kit(_cluster_config(sqlite_url, {"type": "sql-copy", "backend": "main"}), host)
    membership = kit.membership
    assert type(membership).__name__ == "SqlMembership"
    assert [p.ref.type for p in kit.parts_of("orders", "segment store")] == ["sql"]
    membership.acquire(JoinRequest("ids", Member("web-1", "http://127.0.0.1:8001"), 30.0))
    assert membership.propose("ids", 0, [Member("web-1", "http://127.0.0.1:8001")]).epoch == 1
    assert [i.node for i in membership.members("ids")] == ["web-1"]
    kit.close()


def test_registered_membership_settings_are_checked(sqlite_url):
    with pytest.raises(ConfigError, match=r"^cluster\.membership\.bakend: unknown key; .*did you "
                       r"mean 'backend'\?"):
        build_kit(_cluster_config(sqlite_url, {"type": "sql-copy", "bakend": "main"}),
                  _host(MembershipPlugin()))


class HalfMembership:
    renew_interval = None
    where = "nowhere"

    def acquire(self, request):
        raise AssertionError("never joined")

    def close(self):
        pass


class HalfPlugin:
    @hookimpl
    def flakekit_register_memberships(self, register):
        register("half", lambda settings, ctx: HalfMembership())


def test_membership_contract_is_checked_at_build(sqlite_url):
    """A factory result that is not a Membership is refused when the config is built,
    naming the plugin and what it lacks."""
    from flakekit.errors import ContractError

    with pytest.raises(ContractError) as info:
        build_kit(_cluster_config(sqlite_url, "half"), _host(HalfPlugin()))
    text = str(info.value)
    assert text.startswith("cluster.membership: membership 'half' from plugin ")
    assert "returned HalfMembership, which is not a Membership: it lacks " in text
    assert "propose()" in text and "renew()" in text


class CoarsePlugin:
    """The SQL membership, claiming to grant leases in steps of 2 s (as etcd grants whole
    seconds)."""

    @hookimpl
    def flakekit_register_memberships(self, register):
        from flakekit.sql.membership import SqlMembership

        class Coarse(SqlMembership):
            lease_granularity = 2.0

        register("coarse", lambda settings, ctx: Coarse(ctx.backends.engine("main"), ctx.clock))


def test_lease_must_span_three_granularity_steps(sqlite_url):
    host = _host(CoarsePlugin())
    with pytest.raises(ConfigError, match=r"^cluster\.lease: 5s is less than 3 x the lease "
                       r"granularity of membership 'coarse' \(2s\)"):
        build_kit(_cluster_config(sqlite_url, "coarse", lease="5s"), host)
    build_kit(_cluster_config(sqlite_url, "coarse", lease="6s"), host).close()
