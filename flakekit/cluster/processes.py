"""A node served by several processes (``flakekit serve --workers N`` with ``[cluster]``):
each process is a member of its own, with an identity derived from the node's.

Process ``i`` of node ``n0`` is member ``n0.i``: the same name on every start of that
process, so a restarted process takes back its own membership record (incarnation + 1,
fenced as any rejoin) instead of leaving a stranger's lease to lapse. Its advertise URL is
the node's with the port of that process's private listener (``member_port + i``), so a
request forwarded to the owner of a strict key reaches the one process that owns it.

Why not one member per node routing to its processes internally: each process would need
its own fence on the key anyway (two processes serving one claim is exactly what I3
forbids), so every process is a member and the membership's fencing covers it unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

__all__ = ["process_advertise", "process_node", "processes_of"]

_INDEX = re.compile(r"\.(0|[1-9][0-9]{0,2})\Z")


def process_node(node: str, process: int) -> str:
    """The member id of process ``process`` of ``node`` (``n0`` -> ``n0.1``)."""
    return f"{node}.{process}"


def process_advertise(advertise: str, port: int) -> str:
    """``advertise`` with its port replaced by ``port`` (scheme, host and path kept):
    where peers and clients reach one process of the node."""
    parts = urlsplit(advertise)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if not parts.username else f"{parts.username}@{host}"
    return urlunsplit((parts.scheme, f"{netloc}:{port}", parts.path, parts.query, ""))


def processes_of(node: str, members: Iterable[str]) -> list[str]:
    """The members that are processes of ``node`` (``n0.0``, ``n0.1``...), sorted by
    process index; empty when ``node`` has none (a node served by one process is its own
    member, named ``node``)."""
    found = []
    for name in members:
        if name.startswith(node) and (m := _INDEX.fullmatch(name, len(node))) is not None:
            found.append((int(m.group(1)), name))
    return [name for _, name in sorted(found)]
