"""``kit.close()`` releases what ``kit.get(name).start()`` started (issue 10 item 6).

``kit.get()`` hands out the generator without starting it; a caller that starts it itself
and then closes the kit must not leave the worker lease held (the ``system_nodes`` row's
holder set) until the reclaim tiers free it. Real SQL allocator on SQLite.
"""

from __future__ import annotations

import sqlite3

from flakekit.assembly.config import parse_config
from flakekit.assembly.kit import build_kit
from flakekit.pluginhost.host import get_host


def _kit(tmp_path):
    db = tmp_path / "ids.db"
    config = parse_config({
        "backends": {"main": {"url": f"sqlite:///{db}"}},
        "generators": {
            "orders": {"strategy": "snowflake", "allocator": {"type": "sql", "backend": "main"}},
            "other": {"strategy": "snowflake", "allocator": {"type": "sql", "backend": "main"}},
        },
    }, str(tmp_path / "flakekit.toml"))
    return build_kit(config, get_host(), identity=("127.0.0.1", 4000)), db


def _holders(db) -> list[tuple[str, int, str | None]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT service, machine_id, holder FROM system_nodes ORDER BY service").fetchall()


def test_close_releases_a_generator_started_through_get(tmp_path):
    kit, db = _kit(tmp_path)
    gen = kit.get("orders")
    gen.start()
    assert gen.next_id() > 0
    [(service, _, holder)] = _holders(db)
    assert service == "orders" and holder is not None
    kit.close()
    assert [h for _, _, h in _holders(db)] == [None], "the lease is still held after close()"
    assert gen.stats().worker_id is None


def test_close_releases_both_ways_and_never_started_ones_stay_untouched(tmp_path):
    kit, db = _kit(tmp_path)
    kit.get("orders").start()
    kit["other"].next_id()
    assert len([h for _, _, h in _holders(db) if h]) == 2
    kit.close()
    assert [h for _, _, h in _holders(db)] == [None, None]
    kit.close()  # twice is harmless


def test_never_started_generator_takes_no_lease(tmp_path):
    kit, db = _kit(tmp_path)
    kit["other"].next_id()
    kit.close()
    assert [s for s, _, _ in _holders(db)] == ["other"]
