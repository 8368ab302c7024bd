"""Period rows of ``leaf_alloc`` (``KEY@20261201``): the database's clock, a race-free
create, and the listing and pruning of old periods (``flakekit segments prune``).

Kept apart from :mod:`flakekit.sql.leaf` (Leaf's table and its one hot operation): these
are the few statements a periodic counter adds, each one short transaction.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import TYPE_CHECKING

import attrs
from sqlalchemy import delete, select
from sqlalchemy.exc import SQLAlchemyError

from flakekit.errors import ConfigError
from flakekit.sql.dbclock import aware_utc, db_now, dialect_of
from flakekit.values.periods import PERIOD_KEY, PeriodRule

if TYPE_CHECKING:
    from flakekit.sql.leaf import SqlSegmentStore

__all__ = ["PeriodRow", "database_now", "delete_period_rows", "ensure_period_key",
           "period_rows", "prunable"]

#: what :func:`flakekit.generators.periodic.period_description` writes
_DESCRIPTION = re.compile(r"^flakekit (?P<reset>daily|monthly|yearly) period "
                          r"(?P<day>\d{4}-\d{2}-\d{2}) of .* \((?P<zone>[^()]+)\)$")
#: a row is never pruned before its period has been over this long by the database's clock
MIN_AGE = dt.timedelta(hours=1)


def database_now(store: SqlSegmentStore) -> dt.datetime:
    """The database's current time (aware, UTC): what decides a counter's period."""
    dialect = dialect_of(store.engine)
    try:
        with store.engine.connect() as conn:
            value = conn.execute(select(db_now(dialect))).scalar()
    except SQLAlchemyError as exc:
        raise store._translate("reading the database's clock", exc) from None
    now = aware_utc(value)
    if now is None:
        from flakekit.errors import BackendError

        raise BackendError(f"segment store {store.where}: the database's clock gave {value!r}")
    return now


def ensure_period_key(store: SqlSegmentStore, key: str, step: int, start: int,
                      description: str) -> bool:
    """Create a period's row unless it exists; True if this call created it.

    Race-free: every node may try at the boundary, the primary key lets one insert win
    and the others find its row. A row of that name that flakekit did not create for the
    same counter (its description differs) is refused, never shared.
    """
    if store.insert_key(key, start, step, description, f"creating period key {key!r}"):
        return True
    rows = store.info(key)
    if not rows:   # deleted between the insert and the read: a prune racing a boundary
        raise ConfigError("key", f"period key {key!r} vanished while it was created; retry")
    if rows[0].description != description:
        raise ConfigError(
            "key", f"segment key {key!r} exists but is not this counter's period row (its "
            f"description is {rows[0].description!r}, expected {description!r}); rename that "
            "key, or give this generator another key")
    return False


@attrs.frozen
class PeriodRow:
    """One period row: its base key, the period's digits and the row itself."""

    key: str
    base: str
    digits: str
    max_id: object
    step: object
    description: str | None
    update_time: dt.datetime | None
    end: dt.datetime | None = None   # when the period ended (None: not flakekit's row)

    def to_dict(self) -> dict[str, object]:
        return {"key": self.key, "base": self.base, "period": self.digits,
                "ends": self.end.isoformat() if self.end else None,
                "max_id": self.max_id if isinstance(self.max_id, int) else str(self.max_id),
                "step": self.step if isinstance(self.step, int) else str(self.step),
                "description": self.description,
                "update_time": self.update_time.isoformat() if self.update_time else None}


def period_rows(store: SqlSegmentStore, base: str | None = None) -> list[PeriodRow]:
    """Every flakekit period row of the table (of ``base`` only, if given), oldest first
    per base key. Rows of the reserved form whose description is not flakekit's are left
    out: prune never touches a row it did not create."""
    out = []
    for info in store.info():
        found = PERIOD_KEY.match(info.key)
        if found is None or (base is not None and found.group("base") != base):
            continue
        described = _DESCRIPTION.match(info.description or "")
        if described is None:
            continue
        try:
            rule = PeriodRule(described.group("reset"), described.group("zone"))
        except ConfigError:
            continue
        end = rule.period_starting(dt.date.fromisoformat(described.group("day"))).end
        out.append(PeriodRow(info.key, found.group("base"), found.group("digits"),
                             info.max_id, info.step, info.description, info.update_time, end))
    return sorted(out, key=lambda r: (r.base, r.digits))


def delete_period_rows(store: SqlSegmentStore, rows: list[PeriodRow]) -> int:
    """Delete ``rows`` (one transaction); the number deleted."""
    if not rows:
        return 0
    t = store._table
    try:
        with store.engine.begin() as conn:
            result = conn.execute(delete(t).where(t.c.biz_tag.in_([r.key for r in rows])))
    except SQLAlchemyError as exc:
        raise store._translate("deleting old period rows", exc) from None
    return int(result.rowcount or 0)


def prunable(rows: list[PeriodRow], now: dt.datetime, keep: int | None,
             older_than: dt.timedelta | None) -> list[PeriodRow]:
    """The rows a prune deletes: beyond the ``keep`` newest periods of each base key and
    (if given) ended more than ``older_than`` ago; never a period that has not been over
    for :data:`MIN_AGE` by the database's clock ``now`` (a node may still be serving it,
    and a row deleted while in use would start again from its first number)."""
    out = []
    by_base: dict[str, list[PeriodRow]] = {}
    for row in rows:
        by_base.setdefault(row.base, []).append(row)
    for group in by_base.values():
        group.sort(key=lambda r: r.digits, reverse=True)
        for index, row in enumerate(group):
            if row.end is None or row.end > now - MIN_AGE:
                continue
            if keep is not None and index < keep:
                continue
            if older_than is not None and row.end > now - older_than:
                continue
            out.append(row)
    return sorted(out, key=lambda r: (r.base, r.digits))
