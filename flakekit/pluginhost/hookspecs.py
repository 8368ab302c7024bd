"""The flakekit hook specifications.

Registration hooks are called once, when a :class:`~flakekit.pluginhost.host.PluginHost` loads;
event hooks on rare events. No hook is ever called per ID. Arguments may be added in
later versions, never renamed or removed; an implementation may accept fewer.

A registration hook (``flakekit_register_*``) gets one argument, ``register``: the
registration callable, ``register(name, factory, settings=cls, description="")``, where
``settings`` is an attrs class filled from the thing's config table. Each hook says what
its ``factory`` is called with and returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import click

    from flakekit.leases.lease import WorkerLease
    from flakekit.pluginhost import registry as reg  # Register[F] and the factory types

__all__ = ["hookspec"]

from flakekit.pluginhost.markers import hookspec


@hookspec
def flakekit_register_layouts(register: reg.Register[reg.LayoutFactory]) -> None:
    """Contribute bit layouts: ``factory()`` returns a
    :class:`~flakekit.values.layout.BitLayout` (a layout object itself is accepted too;
    no ``settings``)."""


@hookspec
def flakekit_register_clocks(register: reg.Register[reg.ClockFactory]) -> None:
    """Contribute clocks: ``factory(settings)`` returns a
    :class:`~flakekit.values.clock.Clock`; ``settings`` is filled from
    ``clock = {type = NAME, ...}``."""


@hookspec
def flakekit_register_allocators(register: reg.Register[reg.AllocatorFactory]) -> None:
    """Contribute worker-id allocators: ``factory(settings, context)`` returns a
    :class:`~flakekit.leases.lease.WorkerAllocator`; ``context`` is a
    :class:`~flakekit.assembly.context.BuildContext`."""


@hookspec
def flakekit_register_segment_stores(register: reg.Register[reg.SegmentStoreFactory]) -> None:
    """Contribute segment stores (Leaf-style ranges per key): ``factory(settings,
    context)`` returns a segment store."""


@hookspec
def flakekit_register_strategies(register: reg.Register[reg.StrategyFactory]) -> None:
    """Contribute generator strategies (``strategy = NAME`` in ``[generators.NAME]``):
    ``factory(settings, context)`` returns a
    :class:`~flakekit.pluginhost.contracts.Generator`; ``settings`` is filled from the
    generator table's keys other than ``strategy`` and ``format``, and ``context`` is a
    :class:`~flakekit.assembly.context.BuildContext`."""


@hookspec
def flakekit_register_memberships(register: reg.Register[reg.MembershipFactory]) -> None:
    """Contribute cluster membership stores (``[cluster] membership = {type = NAME, ...}``):
    ``factory(settings, context)`` returns a
    :class:`~flakekit.cluster.store_contracts.Membership` (checked when the config is
    built); ``context`` is a :class:`~flakekit.assembly.context.BuildContext` whose
    ``path`` is ``cluster.membership``."""


@hookspec
def flakekit_register_commands(cli: click.Group) -> None:
    """Add commands to the ``flakekit`` command line.

    Called once, when the CLI first needs a command that is not built in or the list of
    commands (``--help``): built-in commands start without it. Add commands with
    ``cli.add_command(...)`` or the ``@cli.command()`` decorator; a name a built-in
    command has is not replaced.

    :param cli: the top-level click group.
    """


@hookspec
def flakekit_lease_acquired(generator: str, lease: WorkerLease) -> None:
    """A generator acquired a worker lease and may now issue IDs.

    :param generator: the generator's name.
    :param lease: the new lease.
    """


@hookspec
def flakekit_lease_renewed(generator: str, lease: WorkerLease) -> None:
    """A worker lease was renewed; called from the renewal thread.

    :param generator: the generator's name.
    :param lease: the renewed lease (new deadline).
    """


@hookspec
def flakekit_operation(operation: str, generator: str, duration_ns: int,
                       attributes: dict[str, Any], error: str | None) -> None:
    """A timed round trip finished: ``segment.fetch``, ``lease.renew``, ``cluster.handoff``
    (for tracing, e.g. OpenTelemetry spans); called on the thread that made it.

    :param operation: which one.
    :param generator: the generator (or strict key) it was for.
    :param duration_ns: how long it took.
    :param attributes: what it was about (key, step, worker id, epoch, ...).
    :param error: why it failed, in one line; ``None`` when it succeeded.
    """


@hookspec
def flakekit_lease_lost(generator: str, lease: WorkerLease, reason: str) -> None:
    """A worker lease is gone for good; the generator has already stopped issuing IDs.

    :param generator: the generator's name.
    :param lease: the lease that was lost.
    :param reason: why, in one line.
    """


@hookspec
def flakekit_clock_moved_backwards(generator: str, clock: str, behind_ns: int,
                                   waited: bool) -> None:
    """A generator's wall clock stepped back.

    :param generator: the generator's name.
    :param clock: the clock's name.
    :param behind_ns: how far back, in nanoseconds.
    :param waited: True if the generator waited it out, False if it raised
        :class:`~flakekit.errors.ClockMovedBackwardsError`.
    """


@hookspec
def flakekit_alert(kind: str, message: str, details: dict[str, Any]) -> None:
    """Something an operator must look at (a reclaim from the last tier, a worker range
    over 80% allocated, ...).

    :param kind: a short machine-readable name, e.g. ``"worker-reclaim"``.
    :param message: one line for people.
    :param details: the facts behind it.
    """
