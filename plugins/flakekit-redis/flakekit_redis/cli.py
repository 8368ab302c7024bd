"""``flakekit redis check|reseed``: the durability verdict, and the operator's way back
after Redis lost its data.

Targets are the Redis namespaces (url, prefix) the config's generators use, or the one
given by ``--url`` / ``--prefix``.
"""

from __future__ import annotations

from typing import Any

import click

from flakekit.plugin import ConfigError, FieldError, config_option, parse_duration_ns

__all__ = ["redis_group"]

#: the hold when no config says (the default ttl 10 s + quarantine 30 s)
DEFAULT_HOLD_NS = 40_000_000_000


def _targets(config_path: str | None, url: str | None, prefix: str) -> list[tuple[Any, int]]:
    """``[(guard, hold_ns)]``: the hold outlasts every lease the namespace could have
    granted (the longest ttl + quarantine among the config's redis allocators)."""
    from flakekit_redis.guard import guard_for
    from flakekit_redis.lease import RedisLeaseAllocator
    from flakekit_redis.segments import RedisSegmentStore

    if url is not None:
        from flakekit_redis import _check_url

        try:
            _check_url(url)
        except FieldError as exc:
            raise ConfigError("--url", exc.message) from None
        return [(guard_for(url, prefix, 5.0), DEFAULT_HOLD_NS)]
    import flakekit

    kit = flakekit.load(config_path)
    found: dict[tuple[str, str], tuple[Any, int]] = {}
    try:
        for name in kit.config.generators:
            for part in kit.parts.get(name, []):
                obj = part.obj
                if isinstance(obj, RedisLeaseAllocator):
                    guard = obj.guard
                    hold = obj.store.session_ms * 1_000_000 + obj.quarantine_ns
                elif isinstance(obj, RedisSegmentStore):
                    guard, hold = obj.guard, 0
                else:
                    continue
                key = (guard.where, guard.prefix)
                old = found.get(key)
                found[key] = (guard, max(hold, old[1] if old else 0))
    finally:
        kit.close()
    if not found:
        raise ConfigError("--config", "no generator of the config uses a redis allocator or "
                          "store; name one with --url redis://host:port/db")
    return [(g, hold or DEFAULT_HOLD_NS) for g, hold in found.values()]


def _target_options(func: Any) -> Any:
    func = click.option("--prefix", default="flakekit", show_default=True,
                        help="The key prefix (with --url).")(func)
    func = click.option("--url", default=None,
                        help="redis://host:port/db instead of the config's targets.")(func)
    return config_option(func)


@click.group("redis")
def redis_group() -> None:
    """Redis allocators and segment stores: durability, and re-seeding after a loss."""


@redis_group.command("check")
@_target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def check(config_path: str | None, url: str | None, prefix: str, as_json: bool) -> None:
    """One line per Redis namespace: what an acknowledged write survives (AOF
    appendfsync, snapshots, replicas, WAIT) and the marker."""
    import json

    from flakekit_redis.durability import durability

    verdicts = [durability(guard) for guard, _ in _targets(config_path, url, prefix)]
    if as_json:
        click.echo(json.dumps([v.to_dict() for v in verdicts], indent=2))
        return
    for verdict in verdicts:
        click.echo(verdict.line)


@redis_group.command("reseed")
@_target_options
@click.option("--floor", type=click.IntRange(0, 2**63 - 2), required=True,
              help="Every counter continues above this: at least the highest ID the "
                   "application ever stored (0 for a new deployment).")
@click.option("--hold", default=None,
              help="Grant no worker id for this long (default: the config's longest ttl + "
                   "quarantine, else 40s), so every lease from before the loss has run out.")
@click.option("--yes", is_flag=True, help="Do not ask: running processes stop using the "
                                          "namespace until restarted.")
def reseed(config_path: str | None, url: str | None, prefix: str, floor: int,
           hold: str | None, yes: bool) -> None:
    """Write a new marker after Redis lost its data (or once, for a new deployment):
    segment keys go to FLOOR or above, epochs and sessions above the server's clock,
    and worker ids wait out the hold."""
    try:
        hold_ns = None if hold is None else parse_duration_ns(hold)
    except ValueError as exc:
        raise ConfigError("--hold", str(exc)) from None
    targets = _targets(config_path, url, prefix)
    if not yes:
        names = ", ".join(f"{g.where} prefix '{g.prefix}'" for g, _ in targets)
        click.confirm(f"re-seed {names} with floor {floor}? Processes using it now stop "
                      "using it", abort=True)
    for guard, default_hold in targets:
        ns = default_hold if hold_ns is None else hold_ns
        done = guard.reseed(floor, ns // 1_000_000)
        was = f" (was {done['previous']})" if done["previous"] else " (there was none)"
        click.echo(f"re-seeded Redis {guard.where} prefix '{guard.prefix}': marker "
                   f"{done['marker']}{was}, floor {floor}, {done['raised']} segment keys "
                   f"raised, worker ids held for {ns / 1e9:g} s")
