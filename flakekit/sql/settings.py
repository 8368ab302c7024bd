"""Settings of the SQL adapters that the plugin host reads at start-up, kept free of
SQLAlchemy so that ``flakekit --help`` and ``flakekit plugins`` do not import it."""

from __future__ import annotations

import attrs

__all__ = ["SqlStoreSettings"]


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
    """

    backend: str = attrs.field(default="default", validator=attrs.validators.instance_of(str))
    table: str = attrs.field(
        default="leaf_alloc",
        validator=[attrs.validators.instance_of(str), _validate_table_name],
    )
