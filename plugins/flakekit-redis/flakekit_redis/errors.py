"""Errors of the Redis plugin (subclasses of flakekit's own, so callers that catch
BackendError keep working)."""

from __future__ import annotations

from flakekit.plugin import BackendError

__all__ = ["RedisDataLostError"]


class RedisDataLostError(BackendError):
    """Redis lost data flakekit wrote (no marker, another marker, a write counter that went
    back): nothing is allocated until an operator runs ``flakekit redis reseed``."""
