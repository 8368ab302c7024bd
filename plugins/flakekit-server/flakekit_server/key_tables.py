"""Segment tables served whole (a store with ``keys = "all"``): every other ``biz_tag`` of
the table answers, as Leaf serves them, through a started
:class:`~flakekit.generators.segment_service.SegmentService` per table; a miss has the
tables re-read in the background, at most once a second, so the event loop never waits
for the database to learn whether a key exists."""

from __future__ import annotations

import copy
import logging
import threading
import time
from typing import Any

from flakekit.plugin import FlakekitError

__all__ = ["KeyTables"]

log = logging.getLogger("flakekit.server")


class KeyTables:
    """The key services of a kit's generators whose store says ``keys = "all"`` (one per
    table; ``skip``: generators whose keys are served elsewhere, the cluster's strict ones),
    keyed by generator name, and the thread that re-reads them after a miss."""

    def __init__(self, kit: Any, generators: dict[str, Any], skip: set[str] | dict[str, str]
                 ) -> None:
        self.services: dict[str, Any] = _key_services(kit, generators, skip)
        self._reread = threading.Event()   # set on a miss: the tables are re-read soon
        self._stopping = False
        self._reader: threading.Thread | None = None
        if self.services:
            self._reader = threading.Thread(target=self._reread_keys, daemon=True,
                                            name="flakekit-server-keys")
            self._reader.start()

    def missed(self) -> None:
        """A key no table had: re-read them soon."""
        self._reread.set()

    def _reread_keys(self) -> None:
        while not self._stopping:
            self._reread.wait(5.0)
            if self._stopping:
                return
            if not self._reread.is_set():
                continue
            self._reread.clear()
            for service in self.services.values():
                try:
                    service.refresh_keys()
                except FlakekitError as exc:
                    log.warning("re-reading segment keys failed: %s", exc)
            time.sleep(1.0)

    def close(self) -> None:
        """Stop the re-reads and the key services (their tails go back)."""
        self._stopping = True
        self._reread.set()
        if self._reader is not None:
            self._reader.join(5)
        for service in self.services.values():
            service.close()


def _key_services(kit: Any, generators: dict[str, Any],
                  skip: set[str] | dict[str, str]) -> dict[str, Any]:
    from flakekit.embed import SegmentService, SqlStoreOptions

    out: dict[str, Any] = {}
    tables: set[str] = set()
    for name, gen in generators.items():
        if name in skip:   # its keys are the cluster's (fenced), never served here
            continue
        options = [p.settings for p in kit.parts_of(name, "segment store")
                   if isinstance(p.settings, SqlStoreOptions) and p.settings.keys == "all"]
        if not options:
            continue
        where = f"{options[0].backend}/{options[0].table}"
        if where in tables:
            continue
        tables.add(where)
        # a new key's first segment is fetched in the background, not on the event loop
        # (not attrs.evolve: it runs the duration converters again and reads their
        # nanoseconds as seconds -- a 1s wait_budget would become 31 years)
        settings = copy.copy(gen.settings)
        object.__setattr__(settings, "preload", False)
        out[name] = SegmentService(gen.store, settings, events=gen.events).start()
    return out
