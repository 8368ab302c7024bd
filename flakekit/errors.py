"""Every error flakekit raises, in one place.

Each class is one failure mode. Validation errors subclass :class:`ValueError`, lookups
:class:`LookupError`, so callers can catch them the way they catch the built-ins. Every
message names the field (a dotted config path where there is one) and says how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "BackendError",
    "ClockMovedBackwardsError",
    "ConfigError",
    "DuplicateRegistrationError",
    "FlakekitError",
    "ForkedProcessError",
    "InvalidIdError",
    "LayoutError",
    "LeaseError",
    "LeaseExpiredError",
    "LeaseLostError",
    "NotStartedError",
    "PartValueError",
    "SchemaError",
    "SegmentUnavailableError",
    "TimeOverflowError",
    "UnknownKeyError",
    "UnknownNameError",
    "WaitTooLongError",
    "WorkerExhaustedError",
    "suggest",
]


def suggest(name: str, known: Iterable[str]) -> str:
    """Return "; did you mean 'x'?" for the closest known name, or ""."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


class FlakekitError(Exception):
    """Base class of every flakekit error."""


class ConfigError(FlakekitError, ValueError):
    """A configuration value is wrong; ``path`` is the dotted path of the field."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class UnknownNameError(ConfigError, LookupError):
    """A name (layout, clock, allocator, generator, ...) is not registered."""

    def __init__(self, path: str, kind: str, name: str, known: Iterable[str]) -> None:
        known = sorted(known)
        self.kind, self.name, self.known = kind, name, known
        listing = ", ".join(known) if known else "(none)"
        super().__init__(
            path, f"unknown {kind} {name!r}; known: {listing}{suggest(name, known)}"
        )

    def __str__(self) -> str:  # KeyError-style quoting would hide the message
        return self.args[0]


class DuplicateRegistrationError(FlakekitError):
    """Two plugins registered the same name for the same kind of thing."""

    def __init__(self, kind: str, name: str, first: str, second: str) -> None:
        self.kind, self.name, self.first, self.second = kind, name, first, second
        # suggest disabling the third-party one: a built-in name is taken on purpose
        culprit = first if second.startswith("flakekit.builtin.") else second
        super().__init__(
            f"{kind} {name!r} is registered by both plugin {first!r} and plugin "
            f"{second!r}; uninstall or disable one (FLAKEKIT_DISABLE_PLUGINS={culprit})"
        )


class LayoutError(FlakekitError, ValueError):
    """A bit layout is not valid; ``field`` names the offending part."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class PartValueError(LayoutError):
    """A value does not fit the field it is meant for."""


class InvalidIdError(FlakekitError, ValueError):
    """An ID to decode is not an ID of this layout."""


class TimeOverflowError(FlakekitError):
    """The layout's time field is full: the layout has run out of years."""


class ClockMovedBackwardsError(FlakekitError):
    """The wall clock stepped back further than the generator may wait out."""

    def __init__(self, clock: str, behind_ns: int, max_backward_ns: int) -> None:
        self.clock, self.behind_ns, self.max_backward_ns = clock, behind_ns, max_backward_ns
        super().__init__(
            f"clock {clock!r} moved backwards by {behind_ns / 1e6:.3f} ms, more than "
            f"max_backward ({max_backward_ns / 1e6:.3f} ms); refusing to issue IDs until "
            "it catches up (fix the host's time sync, or use clock = \"monotonic\")"
        )


class WaitTooLongError(FlakekitError):
    """Starting would mean waiting longer than allowed for the clock to pass a mark."""


class LeaseError(FlakekitError):
    """Base class of worker-lease failures: no ID may be issued."""


class LeaseExpiredError(LeaseError):
    """The worker lease ran out (renewals failed) before it could be renewed."""


class LeaseLostError(LeaseError):
    """Another process owns this worker id now; this generator stops for good."""


class ForkedProcessError(LeaseError):
    """This process was forked from the one that holds the lease."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or (
            "this process was forked from the one that holds the worker lease; a child "
            "must not reuse its parent's worker id: build a new generator in the child "
            "(or call restart() on it) so it gets its own"
        ))


class NotStartedError(FlakekitError):
    """A generator was used before start() (or after close())."""


class WorkerExhaustedError(FlakekitError):
    """Every worker id of the layout is held and none may be reclaimed."""


class BackendError(FlakekitError):
    """A coordination backend (database, ZooKeeper, ...) could not be used."""


class SchemaError(BackendError):
    """The database schema is missing, older or newer than this flakekit."""


class SegmentUnavailableError(FlakekitError):
    """A segment key has no IDs left in memory and none could be fetched in time."""


class UnknownKeyError(FlakekitError, LookupError):
    """A segment key does not exist in the store."""

    def __init__(self, key: str, hint: str = "") -> None:
        self.key = key
        super().__init__(
            f"unknown segment key {key!r}; create it with `flakekit segments create "
            f"{key} --step 1000`{hint}"
        )

    def __str__(self) -> str:
        return self.args[0]
