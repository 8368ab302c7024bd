"""Age rows on the database's own clock: "a minute later" without waiting a minute.

Lease ages in the SQL registry are measured by the database clock (``now() -
last_seen``), so a test moves the stored timestamps back instead of sleeping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["age_rows", "db_now_minus_sql"]


def db_now_minus_sql(dialect: str) -> str:
    """SQL for "the database's now minus ``:age`` seconds" in ``dialect``."""
    if dialect == "postgresql":
        return "now() - make_interval(secs => :age)"
    if dialect in ("mysql", "mariadb"):
        return "UTC_TIMESTAMP(6) - INTERVAL :age SECOND"
    return "strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || :age || ' seconds')"


def age_rows(engine: Engine, seconds: float, where: str = "1=1", *,
             table: str = "system_nodes", column: str = "last_seen", **params: Any) -> None:
    """Set ``column`` of the rows of ``table`` matching ``where`` to the database's now
    minus ``seconds`` (bind values for ``where`` go in ``params``)."""
    from sqlalchemy import text

    expr = db_now_minus_sql(engine.dialect.name)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {table} SET {column} = {expr} WHERE {where}"),
                     {"age": seconds, **params})
