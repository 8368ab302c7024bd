"""Request builders for lease tests: one place for the fields a test does not care about;
and ``http_get``, one plain HTTP GET for tests and benchmarks that talk to a server."""

from __future__ import annotations

import http.client

from flakekit.leases.lease import LeaseRequest

__all__ = ["DRILL_HOST", "DRILL_PORT", "http_get", "lease_request"]

#: the host and port a drill reports (a documentation-only address, never dialled)
DRILL_HOST = "10.9.8.7"
DRILL_PORT = 8080


def lease_request(max_worker_id: int = 1023, service: str = "t", host: str = DRILL_HOST,
                  port: int = DRILL_PORT) -> LeaseRequest:
    """A LeaseRequest for ids 0..max_worker_id of ``service`` from the drill's address."""
    return LeaseRequest(service, max_worker_id, host, port)


def http_get(port: int, path: str, timeout: float = 5, host: str = "127.0.0.1", *,
             headers: dict[str, str] | None = None, method: str = "GET",
             body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET ``path`` from ``host:port`` on a connection of its own (or another ``method``,
    with ``headers`` and a ``body``): the status, the headers (names in lower case) and
    the body."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()
