"""The key fence of cluster mode (issue 12, item 3) in SqlSegmentStore, on real
PostgreSQL, MariaDB and SQLite: claim / release / claim after waiting, a deposed owner's
fetch and give-back change nothing (pingcap/tidb #46444), an older epoch never overrides a
newer one, racing claims admit one, a peer stuck in a fenced fetch costs a bounded wait,
values at the column edges, and Leaf mode (no claim) unchanged."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy.engine import Engine

from flakekit.cluster.store_contracts import KeyClaim, KeyFence
from flakekit.errors import BackendError, FenceError, SegmentRowError
from flakekit.sql import schema
from flakekit.sql.leaf import MAX_ID, SqlSegmentStore
from flakekit.testing import in_threads, proxied
from flakekit.testing.sql_peers import peer_holding, pool_fixture  # noqa: F401

NS = 1_000_000_000
MAX_EPOCH = 2**63 - 1


def store_on(engine: Engine) -> SqlSegmentStore:
    """A store on ``engine`` with the cluster tables and key ``k`` (step 100)."""
    schema.upgrade_schema(engine, "cluster")
    made = SqlSegmentStore(engine)
    made.create("k", 100)
    return made


def claimed(store: SqlSegmentStore) -> KeyClaim:
    """Node ``a``'s claim on ``k`` at epoch 1, made."""
    claim = KeyClaim("k", "a", 1)
    assert store.claim_key(claim, waited=False)
    return claim


@pytest.fixture
def store(pool) -> SqlSegmentStore:
    return store_on(pool())


def max_id(store: SqlSegmentStore, key: str = "k") -> int:
    return store.info(key)[0].max_id


def owner(store: SqlSegmentStore, key: str = "k") -> tuple[str, int, bool]:
    (rec,) = [r for r in store.key_owners() if r.key == key]
    return rec.node, rec.epoch, rec.released


class TestClaims:
    def test_the_store_is_a_key_fence(self, store):
        assert isinstance(store, KeyFence)

    def test_claim_fetch_release(self, store):
        """A first claim creates the owner row; fenced fetches advance max_id; release
        marks the row released (fenced: a second release of the same claim is True)."""
        a = claimed(store)
        assert owner(store) == ("a", 1, False)
        assert store.key_owners()[0].claimed_at_ms > 0
        assert store.fetch("k", claim=a).max_id == 101
        assert store.fetch("k", 10, claim=a).max_id == 111
        assert store.release_key(a)
        assert owner(store) == ("a", 1, True)
        assert store.release_key(a)

    def test_a_released_key_goes_to_the_next_epoch_at_once(self, store):
        """Planned hand-off: once the old owner released, the new owner claims at the new
        epoch without waiting; the old owner's claim is dead."""
        a, b = KeyClaim("k", "a", 1), KeyClaim("k", "b", 2)
        assert store.claim_key(a, waited=False)
        assert not store.claim_key(b, waited=False)  # a still holds it
        assert store.release_key(a)
        assert store.claim_key(b, waited=False)
        assert owner(store) == ("b", 2, False)
        with pytest.raises(FenceError):
            store.fetch("k", claim=a)
        assert store.fetch("k", claim=b).max_id == 101

    def test_claim_by_waiting(self, store):
        """Old owner dead: not released, but the claimer waited out its lease."""
        assert store.claim_key(KeyClaim("k", "a", 1), waited=False)
        assert not store.claim_key(KeyClaim("k", "b", 2), waited=False)
        assert store.claim_key(KeyClaim("k", "b", 2), waited=True)
        assert owner(store) == ("b", 2, False)

    def test_an_older_epoch_never_overrides_a_newer_one(self, store):
        """A claim at an older epoch fails even released or waited; another node at the
        same epoch fails too; the row is unchanged."""
        assert store.claim_key(KeyClaim("k", "b", 5), waited=False)
        assert store.release_key(KeyClaim("k", "b", 5))
        for claim in (KeyClaim("k", "a", 4), KeyClaim("k", "a", 5), KeyClaim("k", "b", 4)):
            assert not store.claim_key(claim, waited=True), claim
        assert owner(store) == ("b", 5, True)

    def test_the_same_node_moves_to_a_newer_epoch(self, store):
        """The owner keeps the key across a view change: claim at the new epoch; its
        claim at the old epoch is then fenced off."""
        old, new = KeyClaim("k", "a", 3), KeyClaim("k", "a", 4)
        assert store.claim_key(old, waited=False)
        assert store.claim_key(new, waited=False)
        assert store.claim_key(new, waited=False)  # already ours
        with pytest.raises(FenceError):
            store.fetch("k", claim=old)
        assert not store.release_key(old)
        assert owner(store) == ("a", 4, False)

    def test_racing_claims_admit_one(self, store):
        """Eight nodes claim a new key at the same epoch at the same moment, then eight
        claim it (released) at the next epoch: each time exactly one wins."""
        store.create("race", 10)
        first = in_threads(lambda i: store.claim_key(KeyClaim("race", f"n{i}", 1), False), 8)
        assert first.count(True) == 1, first
        winner = f"n{first.index(True)}"
        assert store.release_key(KeyClaim("race", winner, 1))
        second = in_threads(lambda i: store.claim_key(KeyClaim("race", f"m{i}", 2), False), 8)
        assert second.count(True) == 1, second
        assert owner(store, "race") == (f"m{second.index(True)}", 2, False)

    def test_first_claims_of_many_new_keys_race_without_an_error(self, db_url):
        """Twenty new keys, each claimed by eight nodes at once, through an engine of the
        user's own (MariaDB's default REPEATABLE READ, not flakekit's READ COMMITTED):
        there the losers are deadlock victims (they locked the same missing row's gap,
        then inserted), not only unique conflicts; every race still ends with one winner
        and no error."""
        from sqlalchemy import create_engine

        engine = create_engine(db_url, pool_size=8)
        schema.upgrade_schema(engine, "cluster")
        store = SqlSegmentStore(engine)
        keys = [f"new{k}" for k in range(20)]
        for key in keys:
            store.create(key, 10)
        for key in keys:
            got = in_threads(lambda i, key=key: store.claim_key(KeyClaim(key, f"n{i}", 1),
                                                                False), 8)
            assert got.count(True) == 1, (key, got)
        engine.dispose()


class TestFence:
    def test_a_deposed_owner_changes_nothing(self, store):
        """pingcap/tidb #46444: a deposed owner (paused, then taken over) fetches and
        gives back its stale cached tail: FenceError / False, max_id unchanged, and the
        new owner goes on from the persisted value."""
        a, b = KeyClaim("k", "a", 1), KeyClaim("k", "b", 2)
        assert store.claim_key(a, waited=False)
        seg = store.fetch("k", claim=a)  # a's segment [1, 101)
        assert store.claim_key(b, waited=True)  # a lapsed; b took over
        with pytest.raises(FenceError, match="owned by node 'b' at epoch 2"):
            store.fetch("k", claim=a)
        assert max_id(store) == 101
        assert not store.give_back("k", seg.max_id, seg.start + 10, claim=a)
        assert max_id(store) == 101
        assert store.fetch("k", claim=b).start == 101

    def test_a_released_claim_cannot_fetch(self, store):
        a = claimed(store)
        seg = store.fetch("k", claim=a)
        assert store.release_key(a)
        with pytest.raises(FenceError, match="released"):
            store.fetch("k", claim=a)
        assert not store.give_back("k", seg.max_id, seg.start, claim=a)
        assert max_id(store) == seg.max_id

    def test_the_owner_gives_back_its_tail(self, store):
        a = claimed(store)
        seg = store.fetch("k", claim=a)
        assert store.give_back("k", seg.max_id, seg.start + 10, claim=a)
        assert max_id(store) == seg.start + 10

    def test_a_regained_key_after_a_give_back_is_no_database_going_back(self, store, caplog):
        """The owner gives its tail back and hands the key on; the next owner gives back
        within its own range; the first one regains the key: its next range starts where
        the key is, with no "the database went back" alarm and nothing skipped (the tail
        it gave back was never its own to remember)."""
        a = claimed(store)
        seg = store.fetch("k", claim=a)                       # a: [1, 101)
        assert store.give_back("k", seg.max_id, seg.start + 10, claim=a)   # max_id 11
        assert store.release_key(a)
        b = KeyClaim("k", "b", 2)
        assert store.claim_key(b, waited=True)
        other = store.fetch("k", claim=b)                     # b: [11, 111)
        assert store.give_back("k", other.max_id, other.start + 5, claim=b)  # max_id 16
        assert store.release_key(b)
        again = KeyClaim("k", "a", 3)
        assert store.claim_key(again, waited=True)
        assert store.fetch("k", claim=again).start == 16
        assert "went back" not in caplog.text

    def test_no_owner_row_means_no_fenced_fetch(self, store):
        with pytest.raises(FenceError, match="never claimed"):
            store.fetch("k", claim=KeyClaim("k", "a", 1))
        assert max_id(store) == 1

    def test_a_claim_for_another_key_is_refused(self, store):
        store.create("other", 10)
        claim = KeyClaim("other", "a", 1)
        assert store.claim_key(claim, waited=False)
        with pytest.raises(ValueError, match="not 'k'"):
            store.fetch("k", claim=claim)
        assert max_id(store) == 1

    def test_leaf_mode_is_unchanged(self, store):
        """Without a claim, fetch and give_back are Leaf's: the owner table plays no
        part (a Leaf server beside flakekit keeps working)."""
        assert store.claim_key(KeyClaim("k", "a", 1), waited=False)
        seg = store.fetch("k")
        assert (seg.start, seg.max_id) == (1, 101)
        assert store.give_back("k", 101, 51)
        assert max_id(store) == 51


class TestEdges:
    def test_epochs_and_names_at_the_column_limits(self, store):
        """Epoch 2**63 - 1, a 128-character key and node: stored and read back exactly;
        out of range is a ValueError before any SQL."""
        key, node = "k" * 128, "n" * 128
        store.create(key, 5)
        top = KeyClaim(key, node, MAX_EPOCH)
        assert store.claim_key(top, waited=False)
        (rec,) = [r for r in store.key_owners() if r.key == key]
        assert (rec.node, rec.epoch) == (node, MAX_EPOCH) and type(rec.epoch) is int
        assert store.fetch(key, claim=top).max_id == 6
        for bad in (KeyClaim(key, node, MAX_EPOCH + 1), KeyClaim(key, node, 0),
                    KeyClaim(key, "n" * 129, 1), KeyClaim("", node, 1)):
            with pytest.raises(ValueError):
                store.claim_key(bad, waited=True)

    def test_a_fenced_fetch_at_the_top_of_the_id_range(self, store):
        """A key whose next segment ends exactly at the BIGINT maximum serves it under
        the fence; the one after is refused, and neither max_id nor the owner moves."""
        store.create("top", 10, start=MAX_ID - 10)
        claim = KeyClaim("top", "a", 1)
        assert store.claim_key(claim, waited=False)
        assert store.fetch("top", claim=claim).max_id == MAX_ID
        with pytest.raises(SegmentRowError):
            store.fetch("top", claim=claim)
        assert max_id(store, "top") == MAX_ID
        assert owner(store, "top") == ("a", 1, False)


OWNER_ROW = "SELECT owner_node FROM flakekit_key_owner WHERE biz_tag = :k"


class TestStuckPeer:
    def test_a_peer_stuck_in_a_fetch_costs_a_bounded_wait(self, store, pool):
        """While a peer sits inside a fenced fetch transaction, a fetch of the key with
        lock_timeout 1 s fails with one BackendError and moves nothing; once the peer's
        transaction ends, the fetch goes through."""
        claim = claimed(store)
        impatient = SqlSegmentStore(pool(lock_timeout=NS))
        with peer_holding(pool(), OWNER_ROW, k="k"):
            with pytest.raises(BackendError) as caught:
                impatient.fetch("k", claim=claim)
            assert "\n" not in str(caught.value)
            assert max_id(store) == 1
        assert impatient.fetch("k", claim=claim).max_id == 101


@pytest.mark.slow
@pytest.mark.parametrize("db_url", [pytest.param("postgresql", marks=pytest.mark.postgresql),
                                    pytest.param("mariadb", marks=pytest.mark.mariadb)],
                         indirect=True)
def test_a_peer_partitioned_inside_a_fenced_fetch(db_url, pool, tcp_proxy):
    """A real peer, partitioned the moment it sends COMMIT of a fenced fetch (its session
    keeps the owner and segment row locks): with the DEFAULT backend settings the server
    ends that session after idle_in_transaction_timeout and the owner's next fetch
    finishes; the peer's range is never committed, so nothing is handed out twice."""
    from sqlalchemy.engine import make_url

    port = make_url(db_url).port or (5432 if db_url.startswith("postgresql") else 3306)
    store = store_on(pool())
    claim = claimed(store)
    proxy = tcp_proxy(port)
    stuck = SqlSegmentStore(pool(proxied(db_url, proxy)))
    stuck.fetch("k", claim=claim)  # warm: the connection is open  -> [1, 101)
    proxy.stall_at(b"COMMIT")
    result: dict[str, object] = {}

    def peer() -> None:
        try:
            result["peer"] = stuck.fetch("k", claim=claim)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            result["peer"] = exc

    thread = threading.Thread(target=peer, daemon=True)
    thread.start()
    assert proxy.marker_hit.wait(60)
    got = store.fetch("k", claim=claim)  # waits for the server to end the stuck session
    assert got.start == 101  # the peer's uncommitted [101, 201) was rolled back
    proxy.stop()
    thread.join(120)
    assert not thread.is_alive()
    assert isinstance(result["peer"], BackendError), result


@pytest.mark.parametrize("db_url", [pytest.param("postgresql", marks=pytest.mark.postgresql),
                                    pytest.param("mariadb", marks=pytest.mark.mariadb)],
                         indirect=True)
def test_an_autocommit_engine_still_holds_the_fence_lock(db_url, pool):
    """On an engine configured with AUTOCOMMIT the fenced transaction is still one
    transaction: its owner-row lock lasts until it ends (another fetch waits, then
    gives up after lock_timeout)."""
    from sqlalchemy import create_engine

    auto = create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        store = store_on(auto)
        claim = claimed(store)
        with peer_holding(auto, OWNER_ROW, k="k"), pytest.raises(BackendError):
            SqlSegmentStore(pool(lock_timeout=NS)).fetch("k", claim=claim)
        assert store.fetch("k", claim=claim).max_id == 101
    finally:
        auto.dispose()
