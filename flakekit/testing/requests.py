"""Request builders for lease tests: one place for the fields a test does not care about."""

from __future__ import annotations

from flakekit.leases.lease import LeaseRequest

__all__ = ["DRILL_HOST", "DRILL_PORT", "lease_request"]

#: the host and port a drill reports (a documentation-only address, never dialled)
DRILL_HOST = "10.9.8.7"
DRILL_PORT = 8080


def lease_request(max_worker_id: int = 1023, service: str = "t", host: str = DRILL_HOST,
                  port: int = DRILL_PORT) -> LeaseRequest:
    """A LeaseRequest for ids 0..max_worker_id of ``service`` from the drill's address."""
    return LeaseRequest(service, max_worker_id, host, port)
