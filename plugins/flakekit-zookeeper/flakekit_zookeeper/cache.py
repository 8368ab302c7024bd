"""The local cache file of ``leaf`` mode: worker id, whose it is, and the last reported time.

Leaf keeps only ``workerID=N`` in ``${java.io.tmpdir}/{name}/leafconf/{port}/
workerID.properties``. That file cannot tell a clock that went back, nor a file baked
into a cloned image. Ours is JSON and holds:

- ``worker_id`` and the ZooKeeper ``node`` it came from;
- ``identity``: generator name, ZooKeeper root, ip, port, host name and machine id. A file
  whose identity is not this process's (a file copied from another machine or another
  ip:port) is ignored;
- ``timestamp``: the last time reported to ZooKeeper (or recorded while it was down),
  Unix ms; start-up refuses when the clock is behind it;
- ``issued_until`` and ``clean``: the high-water mark written by a clean shutdown.

Writes are atomic (temporary file, fsync, rename).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import attrs

__all__ = ["FORMAT", "CacheEntry", "any_cache_time_ms", "load_cache", "machine_identity",
           "save_cache"]

log = logging.getLogger("flakekit.zookeeper")

FORMAT = "flakekit-zookeeper-leaf/1"


def machine_identity() -> dict[str, str]:
    """Host name and machine id (``/etc/machine-id`` when readable)."""
    machine = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            machine = Path(path).read_text().strip()
            break
        except OSError:
            continue
    return {"hostname": socket.gethostname(), "machine_id": machine}


@attrs.frozen
class CacheEntry:
    """One cache file's content."""

    worker_id: int
    identity: dict[str, Any]
    timestamp_ms: int
    node: str = ""
    issued_until_ms: int = 0
    clean: bool = False

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "worker_id": self.worker_id, "node": self.node,
            "identity": self.identity, "timestamp": self.timestamp_ms,
            "issued_until": self.issued_until_ms, "clean": self.clean,
        }, indent=1, sort_keys=True)


def load_cache(path: Path, identity: dict[str, Any]) -> tuple[CacheEntry | None, str]:
    """The entry, or None and why not (missing, unreadable, another identity)."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"no cache file at {path}"
    except (OSError, ValueError) as exc:
        return None, f"cache file {path} is unreadable ({exc})"
    try:
        if raw.get("format") != FORMAT:
            return None, f"cache file {path} has format {raw.get('format')!r}, not {FORMAT!r}"
        entry = CacheEntry(
            worker_id=int(raw["worker_id"]), identity=dict(raw["identity"]),
            timestamp_ms=int(raw["timestamp"]), node=str(raw.get("node", "")),
            issued_until_ms=int(raw.get("issued_until", 0)), clean=bool(raw.get("clean")),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        return None, f"cache file {path} is damaged ({exc!r})"
    # files written before identities had an "instance" belong to instance 0
    theirs_all = {"instance": 0, **entry.identity}
    diff = sorted(k for k in identity if theirs_all.get(k) != identity[k])
    if diff:
        mine = {k: identity[k] for k in diff}
        theirs = {k: theirs_all.get(k) for k in diff}
        return None, (f"cache file {path} belongs to another identity ({theirs} here is "
                      f"{mine}): a copied or cloned file, ignored")
    return entry, ""


def any_cache_time_ms(path: Path) -> int:
    """The latest time a cache file at ``path`` records, whoever wrote it (0 if none).

    A file of another identity (the host name changed: a re-created container) cannot
    give a worker id, but its time can only make the clock check stricter."""
    try:
        raw = json.loads(path.read_text())
        return max(int(raw.get("timestamp", 0)), int(raw.get("issued_until", 0)))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0


def save_cache(path: Path, entry: CacheEntry) -> None:
    """Write atomically: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(entry.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
