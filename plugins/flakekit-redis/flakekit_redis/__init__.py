"""flakekit-redis: worker ids and segments in Redis that never start again from zero.

``allocator = {type = "redis", url = "redis://127.0.0.1:6379/0", service = "orders"}``
``store = {type = "redis", url = "redis://127.0.0.1:6379/0", step = 1000}``

The allocator is the core's :class:`flakekit.plugin.KvLeaseAllocator` over Redis: a
session is a key with ``PX ttl``; a claim is a hash naming its session, created by a
Lua script only if absent; the epoch is a counter's revision (``INCR``); renewals and
releases are fenced by Lua compare-and-set on the claim. The segment store is Leaf's
``leaf_alloc`` as hashes moved by ``HINCRBY`` in Lua.

Every script first checks the namespace's marker (:mod:`flakekit_redis.guard`): a Redis
that restarted without its data, was flushed, or failed over to a replica that missed
writes is refused with one line until ``flakekit redis reseed --floor N``.
``flakekit redis check`` shows the marker and the durability verdict.

See ``docs/redis.md`` and this plugin's README.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
from attrs.validators import in_, instance_of, optional

from flakekit import hookimpl
from flakekit.plugin import (
    Duration,
    FieldError,
    address_from_env,
    check_path_name,
    check_safety_window,
    duration_field,
    namespace_of,
    registers,
    safety_window_field,
)

if TYPE_CHECKING:  # annotations only: the host imports this module for `flakekit --help`
    import click

    from flakekit.plugin import BuildContext
    from flakekit_redis.lease import RedisLeaseAllocator
    from flakekit_redis.segments import RedisSegmentStore

__all__ = ["RedisSettings", "RedisStoreSettings", "build_redis_allocator",
           "build_redis_store"]

__version__ = "0.1.0"

DEFAULT_URL = "redis://127.0.0.1:6379/0"
MIN_TTL_NS = 1_000_000_000


def _check_url(url: str | None) -> None:
    if url is None:
        return
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise FieldError("url", f"'url' must be redis://host:port/db (or rediss://, "
                         f"unix://), got {url.split('@')[-1]!r}")
    try:
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError:
        raise FieldError("url", "'url' has a bad port") from None
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise FieldError("url", f"'url' must end in a database number such as /0, got /{db}")


@attrs.frozen(kw_only=True)
class _Common:
    """What the allocator and the store share."""

    url: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    prefix: str = attrs.field(default="flakekit", validator=instance_of(str))
    connect_timeout: Duration = duration_field("5s", minimum=1, example="5s")
    init: str = attrs.field(default="operator", validator=in_(("operator", "first-use")))
    replicas: int = attrs.field(default=0, validator=instance_of(int))
    wait_timeout: Duration = duration_field("1s", minimum=1_000_000)

    def _check_common(self) -> None:
        _check_url(self.url)
        if not self.prefix or any(c in self.prefix for c in "{}/"):
            raise FieldError("prefix", "'prefix' must be a non-empty name without '{', '}' "
                             f"or '/', got {self.prefix!r}")
        if isinstance(self.replicas, bool) or self.replicas < 0:
            raise FieldError("replicas", f"'replicas' must be 0 or more, got {self.replicas!r}")


@attrs.frozen(kw_only=True)
class RedisSettings(_Common):
    """``allocator = {type = "redis", ...}``.

    Attributes:
        url: ``redis://[:password@]host:port/db`` (default: the environment variable
            ``REDIS_URL``, else ``redis://127.0.0.1:6379/0``).
        prefix: the namespace; keys are ``{prefix}/...`` (one Redis Cluster slot). The
            marker is per prefix (default ``"flakekit"``).
        service: the namespace of the ids (default: the generator's name).
        ttl: the session's expiry (``PX``; default ``"10s"``, at least 1 s).
        connect_timeout: the longest any call waits (default ``"5s"``).
        safety_window: stop issuing this long before the session could expire (default:
            a fifth of the TTL; less than half of it).
        quarantine: how long a freed id stays unclaimable after its holder's last
            possible ID (default ``"30s"``; 0 allowed).
        init: ``"operator"`` (default): no marker, no allocation, until ``flakekit redis
            reseed``; ``"first-use"``: the first allocation in an empty namespace writes
            the marker (a process that starts after a total loss cannot tell).
        replicas: after every write, ``WAIT`` for this many replicas; fewer is a failure
            (default 0).
        wait_timeout: how long ``WAIT`` waits (default ``"1s"``).
    """

    service: str | None = attrs.field(default=None, validator=optional(instance_of(str)))
    ttl: Duration = duration_field("10s", minimum=MIN_TTL_NS)
    safety_window: Duration = safety_window_field("ttl")  # a fifth: 2 s for 10 s
    quarantine: Duration = duration_field("30s")

    def __attrs_post_init__(self) -> None:
        self._check_common()
        if self.ttl % 1_000_000:
            raise FieldError("ttl", "'ttl' must be whole milliseconds (Redis's PX)")
        check_safety_window(self.safety_window, self.ttl, "the TTL", "ttl")
        check_path_name("service", self.service)


@attrs.frozen(kw_only=True)
class RedisStoreSettings(_Common):
    """``store = {type = "redis", ...}``.

    Attributes:
        url, prefix, connect_timeout, init, replicas, wait_timeout: as for the allocator.
        step: create the generator's key with this step on first use (default: the key
            must exist; a missing one is an unknown key, as in Leaf).
        start: the first ID of a key created on first use (default 1; the marker's
            floor if higher).
    """

    step: int | None = attrs.field(default=None, validator=optional(instance_of(int)))
    start: int = attrs.field(default=1, validator=instance_of(int))

    def __attrs_post_init__(self) -> None:
        self._check_common()
        if self.step is not None and not 1 <= self.step <= 100_000_000:
            raise FieldError("step", f"'step' must be from 1 to 100000000, got {self.step}")
        if self.start < 0:
            raise FieldError("start", f"'start' must be 0 or more, got {self.start}")


def _url(s: _Common, ctx: BuildContext) -> str:
    return address_from_env(s.url, "REDIS_URL", DEFAULT_URL, path=f"{ctx.path}.url",
                            check=_check_url)


def guard_of(s: _Common, ctx: BuildContext) -> Any:
    from flakekit_redis.guard import guard_for

    return guard_for(_url(s, ctx), s.prefix, s.connect_timeout / 1e9, init=s.init,
                     replicas=s.replicas, wait_timeout_ms=s.wait_timeout // 1_000_000)


def build_redis_allocator(settings: RedisSettings | None,
                          ctx: BuildContext) -> RedisLeaseAllocator:
    """Factory registered as ``redis``: nothing connects until the first acquire."""
    from flakekit_redis.lease import build_lease_allocator

    s = settings or RedisSettings()
    service = namespace_of(s.service, ctx.generator, path=ctx.path, field="service")
    return build_lease_allocator(s, guard_of(s, ctx), service, ctx)


def build_redis_store(settings: RedisStoreSettings | None, ctx: BuildContext) -> RedisSegmentStore:
    """Factory registered as segment store ``redis``."""
    from flakekit_redis.segments import RedisSegmentStore

    s = settings or RedisStoreSettings()
    return RedisSegmentStore(guard_of(s, ctx), create_step=s.step, start=s.start)


flakekit_register_allocators = registers(
    "redis", build_redis_allocator, settings=RedisSettings,
    description="worker ids leased from Redis: sessions as keys with PX, claims and "
                "renewals fenced by Lua, an INCR revision as the epoch; refuses a "
                "Redis that lost its data",
)


flakekit_register_segment_stores = registers(
    "redis", build_redis_store, settings=RedisStoreSettings,
    description="Leaf's step semantics in Redis (HINCRBY by Lua, give-back fenced); "
                "refuses a Redis that lost its data",
)


@hookimpl
def flakekit_register_commands(cli: click.Group) -> None:
    from flakekit_redis.cli import redis_group

    cli.add_command(redis_group)
