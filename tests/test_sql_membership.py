"""SQL cluster membership (issue 12, item 2) on real PostgreSQL, MariaDB and SQLite: the
MembershipContract suite, the ``cluster`` schema component (``leaf_alloc`` untouched),
deadlines from the send time, bounded waits on a stuck peer, values at the column edges."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import event, inspect, text
from sqlalchemy.engine import Engine

from flakekit.assembly.config import Config, parse_config
from flakekit.cluster.store_contracts import JoinRequest, MemberLease
from flakekit.errors import BackendError, SchemaError
from flakekit.sql import schema
from flakekit.sql.leaf import LEAF_MYSQL_DDL, SqlSegmentStore
from flakekit.sql.membership import SqlMembership
from flakekit.testing import ManualClock, MembershipContract, age_rows
from flakekit.testing.contract_clock import OnManualClock
from flakekit.testing.sql_peers import peer_holding, pool_fixture  # noqa: F401
from flakekit.values.cluster import Member

NS = 1_000_000_000
LEASE_S = 10.0


@pytest.fixture
def engine(pool) -> Engine:
    return pool()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(wall_ns=time.time_ns())


def _expire(engine: Engine, cluster: str, node: str, seconds: float = LEASE_S + 1) -> None:
    age_rows(engine, seconds, "cluster = :c AND node = :n", table="flakekit_members",
             c=cluster, n=node)


class TestSqlMembershipContract(OnManualClock, MembershipContract):
    """Each membership made here is another process on the same database; they share a
    ManualClock for deadlines (the lease itself runs on the database clock)."""

    lease_s = LEASE_S

    @pytest.fixture
    def make_membership(self, engine, clock, closing):
        return lambda: closing(SqlMembership(engine, clock, create_schema=True))

    @pytest.fixture
    def make_with_safety_window(self, engine, clock, closing):
        return lambda window_ns: closing(SqlMembership(engine, clock, create_schema=True,
                                                       safety_window_ns=window_ns))

    @pytest.fixture
    def membership_process(self, engine, db_url):
        schema.upgrade_schema(engine, "cluster")
        return "flakekit.testing.membership_joiner:sql_membership", [db_url], {}

    @pytest.fixture
    def expire(self, engine):
        return lambda cluster, lease: _expire(engine, cluster, lease.member.node)


def join(membership: SqlMembership, cluster: str = "c", node: str = "n1",
         lease_s: float = LEASE_S) -> MemberLease:
    return membership.acquire(JoinRequest(cluster, Member(node, "http://h:1"), lease_s))


# -- schema ------------------------------------------------------------------------------------
class TestSchema:
    def test_db_init_creates_the_three_tables_at_the_current_version(self, engine):
        """The ``cluster`` component creates flakekit_members, flakekit_cluster_view and
        flakekit_key_owner and records the current version; running it again changes nothing."""
        change = schema.upgrade_schema(engine, "cluster")
        assert set(change.created) == {"flakekit_members", "flakekit_cluster_view",
                                       "flakekit_key_owner"}
        with engine.connect() as conn:
            assert schema.read_version(conn, "cluster") == schema.CLUSTER_SCHEMA_VERSION
        again = schema.upgrade_schema(engine, "cluster")
        assert not again.changed and "up to date" in again.describe()

    def test_version_1_members_gain_the_renewal_counter_and_config_digest(self, engine,
                                                                         clock):
        """A version-1 ``flakekit_members`` (no ``renewals``, no ``config_digest``) with a
        member in it is upgraded in place: the row keeps its lease, reads version 0, and
        the node can renew it."""
        lease = join(SqlMembership(engine, clock, create_schema=True))
        with engine.begin() as conn:
            for column in ("renewals", "config_digest"):
                conn.execute(text(f"ALTER TABLE flakekit_members DROP COLUMN {column}"))
            conn.execute(text("UPDATE flakekit_schema SET version = 1 "
                              "WHERE component = 'cluster'"))
        with pytest.raises(SchemaError, match="renewals"):
            schema.check_schema(engine, "cluster")
        change = schema.upgrade_schema(engine, "cluster")
        assert change.before == 1 and change.after == schema.CLUSTER_SCHEMA_VERSION
        membership = SqlMembership(engine, clock)
        (info,) = membership.members("c")
        assert (info.holder, info.version, info.config_digest) == (lease.holder, 0, "")
        membership.renew(lease, 0)
        assert membership.members("c")[0].version == 1

    def test_upgrade_of_a_leaf_database_leaves_leaf_alloc_alone(self, engine):
        """A Leaf database (Leaf's DDL, no flakekit_schema row for segments) gains the
        cluster tables; leaf_alloc's definition and rows are exactly as before, and no
        segments version is written."""
        with engine.begin() as conn:
            if engine.dialect.name in ("mysql", "mariadb"):
                conn.execute(text(LEAF_MYSQL_DDL.format(table="leaf_alloc")))
            else:
                SqlSegmentStore(engine).init_schema()
            conn.execute(text("INSERT INTO leaf_alloc (biz_tag, max_id, step) "
                              "VALUES ('k', 7, 100)"))
        before = self._definition(engine)
        schema.upgrade_schema(engine, "cluster")
        assert self._definition(engine) == before
        with engine.connect() as conn:
            assert conn.execute(text("SELECT max_id, step FROM leaf_alloc")).all() == [(7, 100)]
            assert schema.read_version(conn, "segments") is None

    @staticmethod
    def _definition(engine: Engine) -> Any:
        with engine.connect() as conn:
            if engine.dialect.name in ("mysql", "mariadb"):
                return conn.execute(text("SHOW CREATE TABLE leaf_alloc")).one()[1]
            if engine.dialect.name == "sqlite":
                return conn.execute(text("SELECT sql FROM sqlite_master WHERE "
                                         "name = 'leaf_alloc'")).scalar()
        return [(c["name"], str(c["type"]), c["nullable"], c["default"])
                for c in inspect(engine).get_columns("leaf_alloc")]

    def test_a_missing_schema_says_what_to_run(self, engine, clock):
        """Without create_schema a join on an empty database fails with one line naming
        `flakekit db init` (no SQL error from the middle of the join)."""
        with pytest.raises(SchemaError, match="flakekit db init"):
            join(SqlMembership(engine, clock))

    def test_db_upgrade_targets_the_membership_backend(self):
        """`flakekit db init/upgrade` include the component for the backend of an sql
        membership (the config's [cluster] section), and for nothing else."""
        backends = schema.CLUSTER.backends
        assert backends is not None

        def config(cluster: dict[str, object] | None) -> Config:
            tables = {} if cluster is None else {"cluster": {"name": "ids", **cluster}}
            return parse_config({"backends": {"main": {"url": "sqlite://"}}, **tables})

        assert list(backends(config({"membership": {"type": "sql", "backend": "main"}}))) == [
            "main"]
        assert list(backends(config({}))) == ["default"]
        assert list(backends(config({"membership": {"type": "zookeeper"}}))) == []
        assert list(backends(config(None))) == []


# -- leases ------------------------------------------------------------------------------------
class TestLease:
    def test_deadline_is_counted_from_the_send_time(self, engine, clock):
        """A renewal that takes 4 s (the clock moves while it runs) still ends its lease
        a lease minus the safety window (a fifth by default) after it was *sent*."""
        membership = SqlMembership(engine, clock, create_schema=True)
        lease = join(membership)
        sent = clock.monotonic_ns()

        def slow(*_args: Any) -> None:
            clock.advance(4.0)

        event.listen(engine, "before_cursor_execute", slow)
        try:
            renewed = membership.renew(lease, 0)
        finally:
            event.remove(engine, "before_cursor_execute", slow)
        assert clock.monotonic_ns() >= sent + 4 * NS
        assert renewed.deadline_ns == sent + int(LEASE_S * NS) - int(LEASE_S * NS / 5)

    def test_a_configured_safety_window(self, engine, clock):
        membership = SqlMembership(engine, clock, create_schema=True,
                                   safety_window_ns=3 * NS)
        sent = clock.monotonic_ns()
        assert join(membership).deadline_ns == sent + int(LEASE_S * NS) - 3 * NS
        with pytest.raises(ValueError, match="safety_window"):
            join(SqlMembership(engine, clock, safety_window_ns=9 * NS), node="n2")

    def test_a_renewal_after_a_take_over_names_the_new_holder(self, engine, clock):
        """LeaseLostError says who holds the record now."""
        first = SqlMembership(engine, clock, create_schema=True)
        old = join(first)
        _expire(engine, "c", "n1")
        new = join(SqlMembership(engine, clock))
        with pytest.raises(Exception, match=new.holder) as caught:
            first.renew(old, 0)
        assert type(caught.value).__name__ == "LeaseLostError"

    def test_the_lease_is_the_rows_own_on_the_database_clock(self, engine, clock):
        """A member's lapse is judged by its own lease_ms: a 60 s member aged 30 s is
        live (a second join is refused), a 10 s member aged 11 s is not."""
        membership = SqlMembership(engine, clock, create_schema=True)
        join(membership, node="long", lease_s=60)
        join(membership, node="short", lease_s=10)
        _expire(engine, "c", "long", 30)
        _expire(engine, "c", "short", 11)
        states = {m.node: m.state for m in membership.members("c")}
        assert states == {"long": "alive", "short": "lapsed"}
        with pytest.raises(BackendError, match="live process"):
            join(SqlMembership(engine, clock), node="long")
        join(SqlMembership(engine, clock), node="short")

    def test_renew_interval_follows_the_granted_lease(self, engine, clock):
        membership = SqlMembership(engine, clock, create_schema=True)
        join(membership, lease_s=6)
        assert membership.renew_interval == pytest.approx(2.0)


# -- bounded waits -----------------------------------------------------------------------------
MEMBER_ROW = "SELECT node FROM flakekit_members WHERE cluster = :c AND node = :n"


class TestBoundedWaits:
    def test_a_peer_stuck_in_a_transaction_costs_a_bounded_wait(self, pool, clock, db_url):
        """A peer holds the member row inside an open transaction: a join of that node
        gives up with one BackendError after the lock waits (lock_timeout 1 s, retried
        for lock_retry_s) instead of hanging; on PostgreSQL/MariaDB other nodes are not
        held up at all. Once the peer ends, the join goes through."""
        engine = pool(lock_timeout=NS)
        membership = SqlMembership(engine, clock, create_schema=True, lock_retry_s=2.0)
        lease = join(membership)
        membership.release(lease, 0)
        with peer_holding(pool(), MEMBER_ROW, c="c", n="n1"):
            with pytest.raises(BackendError) as caught:
                join(membership)
            assert "\n" not in str(caught.value)
            if not db_url.startswith("sqlite"):  # row locks: only that node's row waits
                join(membership, node="n2")
        assert join(membership).epoch == lease.epoch + 1

    def test_a_renewal_behind_a_stuck_peer_fails_in_bounded_time(self, pool, clock):
        """A renewal waiting on a locked row fails with BackendError after the backend's
        lock_timeout (the keeper keeps the old deadline and retries) -- it never hangs."""
        engine = pool(lock_timeout=NS)
        membership = SqlMembership(engine, clock, create_schema=True)
        lease = join(membership)
        with peer_holding(pool(), MEMBER_ROW, c="c", n="n1"), \
                pytest.raises(BackendError, match="renewing"):
            membership.renew(lease, 0)
        assert membership.renew(lease, 0).epoch == lease.epoch


# -- column edges ------------------------------------------------------------------------------
class TestEdges:
    def test_names_at_the_column_limits(self, engine, clock):
        membership = SqlMembership(engine, clock, create_schema=True)
        cluster, node = "c" * 64, "n" * 128
        lease = membership.acquire(JoinRequest(cluster, Member(node, "h" * 255, 64)))
        assert membership.members(cluster)[0].member == Member(node, "h" * 255, 64)
        membership.renew(lease, 0)
        for bad in (JoinRequest("c" * 65, Member("n")), JoinRequest("c", Member("n" * 129)),
                    JoinRequest("c", Member("n", "h" * 256)), JoinRequest("c", Member("n", "", 65)),
                    JoinRequest("c", Member("n", "", 0)), JoinRequest("c", Member("n"), 0)):
            with pytest.raises(ValueError):
                membership.acquire(bad)

    def test_the_view_epoch_up_to_the_bigint_maximum(self, engine, clock):
        """A view at 2**63 - 2 moves to 2**63 - 1 (read back exactly); none beyond."""
        membership = SqlMembership(engine, clock, create_schema=True)
        assert membership.propose("c", 0, [Member("a")]) is not None
        top = 2**63 - 1
        with engine.begin() as conn:
            conn.execute(text("UPDATE flakekit_cluster_view SET epoch = :e"), {"e": top - 1})
        view = membership.propose("c", top - 1, [Member("b")])
        assert view is not None and view.epoch == top and type(view.epoch) is int
        assert membership.view("c").epoch == top
        with pytest.raises(ValueError):
            membership.propose("c", top, [Member("c")])
