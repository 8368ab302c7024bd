"""Built-in cluster membership ``sql``: ``[cluster] membership = {type = "sql", backend = NAME}``.

Members and the versioned view live in ``flakekit_members`` / ``flakekit_cluster_view`` of
a ``[backends.NAME]`` database (:class:`flakekit.sql.membership.SqlMembership`), usually
the one holding ``leaf_alloc``, so a node needs no other coordination service. SQLAlchemy
is imported only when a config uses it (``flakekit --help`` stays light).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from flakekit.pluginhost.markers import hookimpl
from flakekit.pluginhost.registry import MembershipFactory, Register

if TYPE_CHECKING:
    from flakekit.assembly.context import BuildContext
    from flakekit.sql.membership import SqlMembership

__all__ = ["SqlMembershipSettings", "build_sql_membership"]


@attrs.frozen
class SqlMembershipSettings:
    """``membership = {type = "sql", ...}``.

    Attributes:
        backend: the ``[backends.NAME]`` holding the membership tables (default
            ``"default"``).
        create_schema: create the ``cluster`` tables at the first join if they are
            missing (default: yes on SQLite, no on database servers, where ``flakekit db
            init`` / ``db upgrade`` are expected, as for the ``sql`` allocator).
    """

    backend: str = attrs.field(default="default", validator=attrs.validators.instance_of(str))
    create_schema: bool | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bool)))


def build_sql_membership(settings: SqlMembershipSettings | None,
                         ctx: BuildContext) -> SqlMembership:
    """Factory registered as ``sql``: the membership on the configured backend (the
    engine is made now, nothing is connected)."""
    from flakekit.sql.membership import SqlMembership

    s = settings or SqlMembershipSettings()
    engine = ctx.backends.engine(s.backend, f"{ctx.path}.backend")
    create = engine.dialect.name == "sqlite" if s.create_schema is None else s.create_schema
    return SqlMembership(engine, ctx.clock, create_schema=create, events=ctx.events)


@hookimpl
def flakekit_register_memberships(register: Register[MembershipFactory]) -> None:
    register("sql", build_sql_membership, settings=SqlMembershipSettings,
             description="members and the cluster view in SQL tables (PostgreSQL, "
             "MariaDB/MySQL, SQLite)")
