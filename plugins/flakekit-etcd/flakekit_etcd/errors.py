"""Errors of the etcd allocator (subclasses of flakekit's own, so callers that catch
BackendError keep working)."""

from __future__ import annotations

from flakekit.plugin import BackendError

__all__ = ["EtcdAuthError", "EtcdVersionError"]


class EtcdAuthError(BackendError):
    """etcd refused the credentials (or asked for some): fix ``username`` / ``password``."""


class EtcdVersionError(BackendError):
    """The endpoint is not an etcd that serves the v3 JSON API (etcd 3.4 or newer)."""
