"""Every error flakekit raises, in one place.

Each class is one failure mode. Validation errors subclass :class:`ValueError`, lookups
:class:`LookupError`, so callers can catch them the way they catch the built-ins. Every
message names the field (a dotted config path where there is one) and says how to fix it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flakekit.values.cluster import Member

__all__ = [
    "BackendError",
    "ClientConfigError",
    "ClientConnectionError",
    "ClientError",
    "ClientRefusedError",
    "ClientUnavailableError",
    "ClockMovedBackwardsError",
    "ClusterError",
    "ClusterUnavailableError",
    "ConfigError",
    "ContractError",
    "DuplicateRegistrationError",
    "FenceError",
    "FieldError",
    "FlakekitError",
    "ForkedProcessError",
    "PluginLoadError",
    "InvalidIdError",
    "KeyMovingError",
    "LayoutError",
    "LeaseError",
    "LeaseExpiredError",
    "LeaseLostError",
    "NoReadingError",
    "NotOwnerError",
    "NotStartedError",
    "PartValueError",
    "SchemaError",
    "PeriodFullError",
    "SegmentRowError",
    "SegmentUnavailableError",
    "StaleOwnerEpochError",
    "TimeOverflowError",
    "UnknownKeyError",
    "UnknownNameError",
    "WaitTooLongError",
    "WorkerExhaustedError",
    "suggest",
]


def suggest(name: str, known: Iterable[str]) -> str:
    """Return "; did you mean 'x'?" for the closest known name, or ""."""
    import difflib  # only for a wrong name: every command imports this module

    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


class FlakekitError(Exception):
    """Base class of every flakekit error."""


class ConfigError(FlakekitError, ValueError):
    """A configuration value is wrong; ``path`` is the dotted path of the field."""

    def __init__(self, path: str, message: str) -> None:
        self.path, self.message = path, message
        super().__init__(f"{path}: {message}" if path else message)


class FieldError(FlakekitError, ValueError):
    """A check across settings fields failed; ``field`` names the one to fix.

    Raised from ``__attrs_post_init__`` so that building the settings reports
    ``path.field: message`` without reading the field name out of the message.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(message)


class UnknownNameError(ConfigError, LookupError):
    """A name (layout, clock, allocator, generator, ...) is not registered."""

    def __init__(self, path: str, kind: str, name: str, known: Iterable[str],
                 hint: str = "") -> None:
        known = sorted(known)
        self.kind, self.name, self.known = kind, name, known
        listing = ", ".join(known) if known else "(none)"
        super().__init__(
            path, f"unknown {kind} {name!r}{hint}; known: {listing}"
            f"{'' if hint else suggest(name, known)}"
        )

    def __str__(self) -> str:  # KeyError-style quoting would hide the message
        return str(self.args[0])


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


class ContractError(ConfigError, TypeError):
    """A plugin's factory returned an object that does not meet its contract."""

    def __init__(
        self, path: str, kind: str, name: str, origin: str, got: str, contract: str,
        missing: list[str],
    ) -> None:
        self.kind, self.name, self.origin, self.missing = kind, name, origin, missing
        lacks = f"lacks {', '.join(missing)}" if missing else "does not match it"
        super().__init__(path, f"{kind} {name!r} from {origin} returned {got}, which is not a "
                         f"{contract}: it {lacks}; fix or disable that plugin")


class PluginLoadError(ConfigError):
    """An installed plugin failed to import or to register."""

    def __init__(self, message: str) -> None:
        super().__init__("", message)


class LayoutError(FlakekitError, ValueError):
    """A bit layout is not valid; ``field`` names the offending part."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


class PartValueError(LayoutError):
    """A value does not fit the field it is meant for."""


class InvalidIdError(FlakekitError, ValueError):
    """An ID to decode is not an ID of this layout."""


class NoReadingError(FlakekitError):
    """No layout reads an ID as one made by now: it fits none, or its time is no date in
    any layout's era (``flakekit decode`` exits 1: the input was well formed)."""


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


class SegmentRowError(SchemaError):
    """A segment key's row cannot serve a fetch: a value that is not a usable integer, or
    a next range past the column's maximum. Nothing was allocated; waiting will not help.

    ``room`` is how many IDs the key can still hand out (None when the row is unusable).
    """

    def __init__(self, key: str, message: str, room: int | None = None) -> None:
        self.key, self.room = key, room
        super().__init__(message)


class SegmentUnavailableError(FlakekitError):
    """A segment key has no IDs left in memory and none could be fetched in time."""


class PeriodFullError(SegmentUnavailableError):
    """A periodic counter's period holds no more numbers of its fixed width (it starts
    again with the next period; a wider number is never issued)."""


class UnknownKeyError(FlakekitError, LookupError):
    """A segment key does not exist in the store."""

    def __init__(self, key: str, hint: str = "", config: str | None = None) -> None:
        import shlex

        self.key, self.hint, self.config = key, hint, config
        where = f" -c {shlex.quote(config)}" if config else ""  # the command must work pasted
        super().__init__(
            f"unknown segment key {key!r}; create it with `flakekit segments create "
            f"{shlex.quote(key)} --step 1000{where}`{hint}"
        )

    def for_config(self, config: str | None) -> UnknownKeyError:
        """The same error, its command naming the config file the key was looked up with."""
        if not config or self.config:
            return self
        return UnknownKeyError(self.key, self.hint, config)

    def __str__(self) -> str:
        return str(self.args[0])


# -- cluster mode -----------------------------------------------------------------------------
class ClusterError(FlakekitError):
    """Base class of cluster-mode refusals: this node gives no ID for the key now."""


class NotOwnerError(ClusterError):
    """This node does not own the strict key; ``owner`` (a Member) and ``epoch`` say who
    does in the view this node knows (HTTP: forward once, or 421 to a flakekit client)."""

    def __init__(self, message: str, *, owner: Member | None = None, epoch: int = 0) -> None:
        super().__init__(message)
        self.owner = owner
        self.epoch = epoch


class _RetryLaterError(ClusterError):
    """A refusal for now: asked again after ``retry_after`` seconds, the node may serve
    (HTTP 503 with ``Retry-After``)."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class KeyMovingError(_RetryLaterError):
    """The strict key is being handed off and did not settle within ``handoff_wait``
    (HTTP 503 with ``Retry-After: retry_after`` seconds)."""


class ClusterUnavailableError(_RetryLaterError):
    """This node's membership lease ran out (store or coordination service unreachable):
    it serves no strict key until it renews (HTTP 503). Never a stale ID."""


class FenceError(ClusterError):
    """A fenced write found another owner or a newer epoch in the store: this node's
    claim on the key is gone (its segments must be dropped)."""


# -- the HTTP client (flakekit.client, flakekit.aio_client) ------------------------------------
class ClientError(FlakekitError):
    """Base class of what the HTTP client raises: no ID was returned."""


class ClientConfigError(ClientError, ConfigError):
    """A client argument is wrong (a URL's scheme, host or port; a count); ``path`` names it."""


class ClientConnectionError(ClientError, ConnectionError):
    """No node could be reached (refused, reset, timed out) within the retry budget."""


class ClientRefusedError(ClientError):
    """A node answered with an error (``status``, machine-readable ``code``); retrying the
    same request will not help (a 4xx), or did not within the budget (a 503)."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", url: str = "") -> None:
        super().__init__(message)
        self.status, self.code, self.url = status, code, url


class ClientUnavailableError(ClientRefusedError):
    """Every attempt within the retry budget was answered 503 (key moving, lease, refill)."""


class StaleOwnerEpochError(ClientError):
    """An answer came from an owner epoch older than one already seen for the key: its IDs
    may be out of order with ones already returned, so they are dropped (Kafka KIP-320)."""

    def __init__(self, message: str, *, key: str = "", epoch: int = 0, seen: int = 0) -> None:
        super().__init__(message)
        self.key, self.epoch, self.seen = key, epoch, seen
