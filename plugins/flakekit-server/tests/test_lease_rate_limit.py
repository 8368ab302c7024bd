"""The lease endpoints' per-token rate limit, on an injected clock (no server)."""

from __future__ import annotations

from flakekit_server.lease_api import RateLimit


class TestRateLimit:
    def test_burst_then_rate_per_client(self):
        """A client may spend its burst at once, then one request per 1/rate seconds; the
        wait it is told is the time until the next one; other clients are not affected."""
        now = [100.0]
        limit = RateLimit(rate=10.0, burst=3.0, clock=lambda: now[0])
        assert [limit.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
        wait = limit.take("a")
        assert 0.09 < wait <= 0.1
        assert limit.take("b") == 0.0
        now[0] += wait
        assert limit.take("a") == 0.0
        assert limit.take("a") > 0.0

    def test_saved_up_no_more_than_the_burst(self):
        """An idle client saves up at most ``burst`` requests."""
        now = [0.0]
        limit = RateLimit(rate=10.0, burst=2.0, clock=lambda: now[0])
        limit.take("a")
        now[0] += 3600.0
        assert [limit.take("a") > 0 for _ in range(3)] == [False, False, True]
