"""Settings of the SQL adapters that the plugin host reads at start-up, kept free of
SQLAlchemy so that ``flakekit --help`` and ``flakekit plugins`` do not import it."""

from __future__ import annotations

import attrs

__all__ = ["DEFAULT_FAILOVER_SKIP", "SqlStoreSettings"]

#: the default skip-ahead after a fail-over: 1,024 fetches of the largest size a fetch
#: can ask for (``hunger_max`` 16 x ``max_step`` 1,000,000) -- more than a key loses in
#: minutes of replication lag, and 2^63 leaves room for half a billion of them
DEFAULT_FAILOVER_SKIP = 1024 * 16 * 1_000_000



def _validate_table_name(instance: object, attribute: attrs.Attribute, value: str) -> None:
    if not value.replace("_", "").isalnum() or not value[:1].isalpha():
        raise ValueError(f"a table name must be letters, digits and '_' , got {value!r}")


@attrs.frozen
class SqlStoreSettings:
    """``store = {type = "sql", ...}`` of a segment generator.

    Attributes:
        backend: the ``[backends.NAME]`` holding the table (default ``"default"``).
        table: the table name (default ``"leaf_alloc"``, Leaf's; change it only to keep
            several independent Leaf-style tables in one database).
        failover_skip: how far a key's ``max_id`` jumps when a fetch finds the key last
            written by another primary (a fail-over; default 16,384,000,000: 1,024
            fetches of the largest size, docs/replicated-databases.md).
    """

    backend: str = attrs.field(default="default", validator=attrs.validators.instance_of(str))
    table: str = attrs.field(
        default="leaf_alloc",
        validator=[attrs.validators.instance_of(str), _validate_table_name],
    )
    failover_skip: int = attrs.field(
        default=DEFAULT_FAILOVER_SKIP,
        validator=[attrs.validators.instance_of(int), attrs.validators.ge(1),
                   attrs.validators.le(2**62)],
    )
