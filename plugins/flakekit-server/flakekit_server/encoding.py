"""How the JSON API writes IDs: the body forms of ``format=numbers|strings|ranges|text``
or an encoding, decimal IDs written in bulk, and a large batch encoded in slices with the
event loop's other work in between.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from flakekit.plugin import ENCODINGS, IdBatch, IdFormat
from flakekit_server.answers import JSON, TEXT, Response

__all__ = ["DECIMAL_SLICE", "ENCODE_SLICE", "FORMATS", "Bodies", "decimal_join"]

#: what ``format=`` takes
FORMATS = ("numbers", "strings", "ranges", "text", *ENCODINGS)
#: an offloaded batch is encoded on the event loop this many IDs at a time (about 0.1 ms
#: each), and the loop answers other requests between slices. Not in the worker thread:
#: encoding 100k IDs is one 18 ms C call that holds the GIL, and the loop would wait for
#: it (or for the 5 ms switch interval) on every request meanwhile
ENCODE_SLICE = 1024
#: the same for decimal IDs, written in bulk (:func:`decimal_join`, about 8x faster per ID)
DECIMAL_SLICE = 8192
#: consecutive IDs are written a block at a time: the IDs k*1000 .. k*1000+999 are
#: ``str(k).join(_pieces(sep))``, one C call per block instead of a ``str()`` per ID
_BLOCK = 1000
_PIECES: dict[bytes, list[bytes]] = {}

#: content type, before the IDs, their separator, ``encode(ids)``, after the IDs
BodyForm = tuple[bytes, bytes, bytes, Callable[[Any], bytes], bytes]


def _pieces(sep: bytes) -> list[bytes]:
    """``b""``, then three digits and ``sep`` for each of 000..999 (what goes between
    the copies of a block's ``str(k)``)."""
    pieces = _PIECES.get(sep)
    if pieces is None:
        pieces = _PIECES[sep] = [b"", *(b"%03d%s" % (i, sep) for i in range(_BLOCK))]
    return pieces


def decimal_join(ids: Any, sep: bytes) -> bytes:
    """``sep.join`` of ``ids`` written in decimal, as bytes; an :class:`IdBatch` or a
    ``range`` of step 1 in bulk (a batch is a few such ranges), anything else one by one."""
    if isinstance(ids, IdBatch):
        return sep.join([_range_bytes(r, sep) for r in ids.ranges if len(r)])
    if isinstance(ids, range):
        return _range_bytes(ids, sep)
    return sep.join([b"%d" % i for i in ids])


def _range_bytes(r: range, sep: bytes) -> bytes:
    start, stop = r.start, r.stop
    if r.step != 1 or start < 0 or stop - start < 8:
        return sep.join([b"%d" % i for i in r])
    if start < _BLOCK:   # "007" is no way to write 7: the numbers below 1000 one by one
        head = sep.join([b"%d" % i for i in range(start, min(stop, _BLOCK))])
        return head if stop <= _BLOCK else head + sep + _range_bytes(range(_BLOCK, stop), sep)
    pieces = _pieces(sep)
    parts = []
    k, i = divmod(start, _BLOCK)
    left = stop - start
    while left > 0:
        j = min(_BLOCK, i + left)
        if i == 0 and j == _BLOCK:
            parts.append((b"%d" % k).join(pieces))
        else:
            some = pieces[i:j + 1]   # entries i..j-1 behind what becomes b""
            some[0] = b""
            parts.append((b"%d" % k).join(some))
        left -= j - i
        k += 1
        i = 0
    return b"".join(parts)[:-len(sep)]


def _decimal(sep: bytes) -> Callable[[Any], bytes]:
    def decimal(ids: Any) -> bytes:
        return decimal_join(ids, sep)
    return decimal


class Bodies:
    """The JSON API's answers for the generators of one service (``id_formats``: each
    generator's configured :class:`IdFormat`, what ``format=strings`` writes)."""

    def __init__(self, id_formats: dict[str, IdFormat]) -> None:
        self.id_formats = id_formats
        self._heads: dict[tuple[str, int], bytes] = {}

    def format(self, name: str, count: int, fmt: str, ids: Any, ranges: Any,
               headers: bytes = b"") -> Response:
        """The JSON API's answer: ``ids`` (or their ``ranges``) in format ``fmt``."""
        if fmt == "ranges":
            return self._ranges(name, count, ranges, headers)
        ctype, before, _, encode, after = self.body_form(name, count, fmt)
        return 200, ctype, b"".join((before, encode(ids), after)), headers, "next"

    async def format_in_slices(self, name: str, count: int, fmt: str,
                               batch: IdBatch) -> Response:
        """:meth:`format` of a large batch, ``ENCODE_SLICE`` IDs at a time with the event
        loop's other work in between; the same bytes."""
        if fmt == "ranges":
            return self._ranges(name, count, batch.ranges, b"")
        ctype, before, sep, encode, after = self.body_form(name, count, fmt)
        size = DECIMAL_SLICE if encode.__name__ == "decimal" else ENCODE_SLICE
        parts: list[bytes] = []
        for r in batch.ranges:
            for at in range(0, len(r), size):
                parts.append(encode(r[at:at + size]))
                await asyncio.sleep(0)
        return 200, ctype, b"".join((before, sep.join(parts), after)), b"", "next"

    def _ranges(self, name: str, count: int, ranges: Any, headers: bytes) -> Response:
        head = self._head(name, count)
        parts = ",".join(f'{{"start":{r.start},"stop":{r.stop},"step":{r.step}}}'
                         for r in ranges)
        return 200, JSON, head + b'"ranges":[' + parts.encode() + b"]}", headers, "next"

    def _head(self, name: str, count: int) -> bytes:
        head = self._heads.get((name, count))
        if head is None:
            head = b'{"generator":' + json.dumps(name).encode() + b',"count":%d,' % count
            if len(self._heads) < 4096:
                self._heads[name, count] = head
        return head

    def body_form(self, name: str, count: int, fmt: str) -> BodyForm:
        """How a list of IDs is written in format ``fmt`` (not ``ranges``): content type,
        what comes before the IDs, their separator, ``encode(ids)`` (the IDs joined by
        it; named ``decimal`` when written in bulk) and what comes after."""
        if fmt == "text":
            return TEXT, b"", b"\n", _decimal(b"\n"), b"\n"
        head = self._head(name, count)
        if fmt == "strings" or fmt in ENCODINGS:
            # strings: the generator's configured form (decimal by default); an encoding:
            # that encoding with the generator's prefix (flakekit.formats)
            own = self.id_formats[name]
            form = own if fmt == "strings" else IdFormat(fmt, own.prefix)
            if form == IdFormat():
                return JSON, head + b'"ids":["', b'","', _decimal(b'","'), b'"]}'
            return (JSON, head + b'"ids":["', b'","',
                    lambda ids: '","'.join(form.encode_many(ids)).encode(), b'"]}')
        return JSON, head + b'"ids":[', b",", _decimal(b","), b"]}"
