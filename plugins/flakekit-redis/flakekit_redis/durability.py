"""What an acknowledged write to this Redis survives, in one line (``flakekit redis
check``), like the SQL backends' verdict.

The facts: ``appendonly`` / ``appendfsync`` / ``save`` (``CONFIG GET``; managed services
that hide ``CONFIG`` fall back to ``INFO persistence``), the role and connected
replicas (``INFO replication``), and whether the plugin ``WAIT``s for replicas
(``replicas = N`` in the config). The marker guard refuses after a loss in every case;
the verdict says how likely a loss is, and what it would cost (a reseed).
"""

from __future__ import annotations

from typing import Any

import attrs

from flakekit.plugin import BackendError
from flakekit_redis.guard import Guard, eviction

__all__ = ["Verdict", "durability"]

DURABLE, AT_RISK, UNSAFE = "durable", "at risk", "unsafe"


@attrs.frozen
class Verdict:
    """``level`` is ``durable``, ``at risk`` or ``unsafe``; ``line`` says why in one line."""

    where: str
    prefix: str
    level: str
    line: str
    facts: dict[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "prefix": self.prefix, "level": self.level,
                "line": self.line, **self.facts}


def _config(guard: Guard, name: str) -> str | None:
    try:
        got = guard.call(f"reading {name}", guard.client.config_get, name)
    except BackendError:
        return None   # CONFIG is disabled or renamed (managed Redis)
    value = got.get(name)
    return None if value is None else str(value)


def durability(guard: Guard) -> Verdict:
    """The verdict for ``guard``'s Redis (BackendError when it does not answer)."""
    info = guard.call("reading INFO", guard.client.info, "persistence", "replication",
                      "memory")
    aof = _config(guard, "appendonly")
    if aof is None:
        aof = "yes" if int(info.get("aof_enabled", 0)) else "no"
    fsync = _config(guard, "appendfsync")
    save = _config(guard, "save")
    role = str(info.get("role", "master"))
    connected = int(info.get("connected_slaves", 0))
    waits = guard.replicas
    marker = guard.status()
    facts = {"appendonly": aof, "appendfsync": fsync, "save": save, "role": role,
             "replicas_connected": connected, "wait_replicas": waits,
             "maxmemory_policy": info.get("maxmemory_policy"),
             "marker": marker.get("id"), "marker_seq": marker.get("seq")}
    if aof == "yes" and fsync == "always":
        disk, disk_ok = "AOF with appendfsync always (a write survives a restart)", True
    elif aof == "yes":
        disk, disk_ok = (f"AOF with appendfsync {fsync or '?'} (a crash can lose the last "
                         "second of writes)"), False
    elif save:
        disk, disk_ok = (f"RDB snapshots only (save \"{save}\": a restart loses every write "
                         "since the last snapshot)"), False
    else:
        disk, disk_ok = "no persistence (a restart loses everything)", False
    if role != "master":
        repl, repl_ok = "this server is a replica (read-only): point url at the primary", False
    elif waits:
        repl = f"every write WAITs for {waits} of {connected} connected replicas"
        repl_ok = connected >= waits
        if not repl_ok:
            repl += " (too few: writes fail)"
    elif connected:
        repl, repl_ok = (f"{connected} replicas, asynchronous (a fail-over can lose the last "
                         f"writes; set replicas = {connected} to WAIT)"), False
    else:
        repl, repl_ok = "no replicas", False
    if disk_ok or (waits and repl_ok):
        level = DURABLE
    elif aof == "yes" or save or (connected and role == "master"):
        level = AT_RISK
    else:
        level = UNSAFE
    evicts = eviction(info)
    if evicts:
        disk += f"; it {evicts}: refused"
    if role != "master" or evicts:
        level = UNSAFE
    if marker:
        mark = f"marker {marker.get('id')} ({marker.get('how', '?')}, seq {marker.get('seq')})"
    else:
        mark = "no marker: allocations are refused until `flakekit redis reseed`"
    after = ("" if level == DURABLE or not marker else
             "; after a loss flakekit refuses until `flakekit redis reseed`")
    line = (f"Redis {guard.where} prefix '{guard.prefix}': {level}: {disk}; {repl}; "
            f"{mark}{after}")
    return Verdict(guard.where, guard.prefix, level, line, facts)
