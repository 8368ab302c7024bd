"""Registries: what plugins contribute, by kind and name.

Registration hooks receive a :class:`Register` bound to the calling plugin, so a name
registered twice fails with both plugin names. Users pick strategies by name in config;
nothing is chosen by hook order. ``Register`` is generic in the factory type of its kind
(``Register[AllocatorFactory]``...), so mypy checks that a plugin's factory returns what
the kind's contract asks (the build checks it again at run time, with ``isinstance``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

import attrs

from flakekit.errors import DuplicateRegistrationError, UnknownNameError
from flakekit.values.layout import BitLayout

if TYPE_CHECKING:  # the factory types are for mypy: registering imports no contract
    from flakekit.assembly.context import BuildContext
    from flakekit.cluster.store_contracts import Membership
    from flakekit.generators.stores import SegmentStore
    from flakekit.leases.lease import WorkerAllocator
    from flakekit.pluginhost.contracts import Generator
    from flakekit.values.clock import Clock

__all__ = [
    "AllocatorFactory",
    "ClockFactory",
    "LayoutFactory",
    "MembershipFactory",
    "Register",
    "Registration",
    "Registry",
    "SegmentStoreFactory",
    "StrategyFactory",
]

#: what each registration hook's ``register`` takes as ``factory`` (``settings``: an
#: instance of the attrs class registered with it, or None when it has none)
LayoutFactory: TypeAlias = "Callable[[], BitLayout] | BitLayout"
ClockFactory: TypeAlias = "Callable[[Any], Clock]"
AllocatorFactory: TypeAlias = "Callable[[Any, BuildContext], WorkerAllocator]"
SegmentStoreFactory: TypeAlias = "Callable[[Any, BuildContext], SegmentStore]"
StrategyFactory: TypeAlias = "Callable[[Any, BuildContext], Generator]"
MembershipFactory: TypeAlias = "Callable[[Any, BuildContext], Membership]"

F = TypeVar("F", bound="Callable[..., Any] | BitLayout")

_NAME = re.compile(r"^[a-z][a-z0-9_.-]*$")


@attrs.frozen
class Registration:
    """One registered thing.

    Attributes:
        kind: "layout", "clock", "allocator", "segment store", "strategy" or "membership".
        name: the name config files use.
        factory: builds the thing (see the hook reference for each kind's signature).
        settings: attrs class of the settings the factory takes, or None.
        description: one line for listings.
        plugin: the name of the plugin that registered it.
        origin: the plugin, its distribution and module, for error messages.
    """

    kind: str
    name: str
    factory: Callable[..., Any] | BitLayout = attrs.field(eq=False)
    settings: type | None = None
    description: str = ""
    plugin: str = ""
    origin: str = ""

    def create(self, *args: Any) -> Any:
        """Call the factory (a registered layout object is returned as it is)."""
        if isinstance(self.factory, BitLayout):
            return self.factory
        return self.factory(*args)


@attrs.define
class Registry:
    """All registrations of one kind."""

    kind: str
    _items: dict[str, Registration] = attrs.Factory(dict)

    def register(
        self, plugin: str, name: str, factory: Callable[..., Any] | BitLayout, *,
        settings: type | None = None, description: str = "", origin: str = "",
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"plugin {plugin!r} registered {self.kind} name {name!r}; names must be "
                "lower case letters, digits, '-', '_' or '.', starting with a letter"
            )
        if not callable(factory) and not isinstance(factory, BitLayout):
            raise TypeError(f"plugin {plugin!r} registered {self.kind} {name!r} with a "
                            "non-callable factory")
        if settings is not None and not attrs.has(settings):
            raise TypeError(f"plugin {plugin!r}: settings of {self.kind} {name!r} must be an attrs "
                            "class")
        if name in self._items:
            raise DuplicateRegistrationError(self.kind, name, self._items[name].plugin, plugin)
        self._items[name] = Registration(self.kind, name, factory, settings, description, plugin,
                                         origin or f"plugin {plugin!r}")

    def binder(self, plugin: str, origin: str = "") -> Register[Any]:
        return Register(self, plugin, origin)

    def get(self, name: str, path: str = "") -> Registration:
        try:
            return self._items[name]
        except KeyError:
            from flakekit.pluginhost.bundled import install_hint

            raise UnknownNameError(path, self.kind, name, self._items,
                                   install_hint(self.kind, name)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[Registration]:
        return iter(sorted(self._items.values(), key=lambda r: r.name))

    def names(self) -> list[str]:
        return sorted(self._items)

    def remove_plugin(self, plugin: str) -> None:
        self._items = {k: v for k, v in self._items.items() if v.plugin != plugin}


@attrs.frozen
class Register(Generic[F]):
    """The ``register`` callable a registration hook receives; ``F`` is its kind's
    factory type (:data:`AllocatorFactory`...).

    ``register(name, factory, settings=None, description="")``
    """

    _registry: Registry
    plugin: str
    origin: str = ""

    def __call__(
        self, name: str, factory: F, settings: type | None = None, description: str = "",
    ) -> None:
        self._registry.register(
            self.plugin, name, factory, settings=settings, description=description,
            origin=self.origin,
        )
