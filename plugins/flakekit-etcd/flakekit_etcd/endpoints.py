"""Parsing ``endpoints`` (no client imported: config checks stay cheap)."""

from __future__ import annotations

__all__ = ["parse_endpoints"]


def parse_endpoints(text: str) -> list[tuple[str, int, str]]:
    """``"a:2379,http://b:2379"`` -> [(host, port, protocol)]; ValueError naming the bad one."""
    out = []
    for raw in text.split(","):
        item = raw.strip()
        protocol = "http"
        for scheme in ("http://", "https://"):
            if item.startswith(scheme):
                protocol, item = scheme[:-3], item[len(scheme):]
        item = item.rstrip("/")
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, "2379"
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"endpoint {raw.strip()!r} is not host:port (such as "
                             "'127.0.0.1:2379')")
        out.append((host, int(port), protocol))
    if not out:
        raise ValueError("endpoints is empty; give host:port[,host:port...]")
    return out
