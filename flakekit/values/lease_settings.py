"""Settings pieces every coordination-service plugin repeats (etcd, ZooKeeper, ...): the
safety window that defaults to a fifth of the lease and must stay under half of it, and
the names that become one key or znode segment. Plugins reach them through
:mod:`flakekit.plugin`."""

from __future__ import annotations

from typing import Any

import attrs

from flakekit.errors import FieldError
from flakekit.values.timeunits import Duration, duration_field

__all__ = ["check_path_name", "check_safety_window", "safety_window_field"]


def safety_window_field(lease: str) -> Any:
    """A ``safety_window`` attrs field whose default is a fifth of the field ``lease``
    (2 s for a 10 s lease), which claimers count on."""
    return duration_field(attrs.Factory(lambda s: Duration(getattr(s, lease) // 5),
                                        takes_self=True))


def check_safety_window(window: int | None, lease: int | None, lease_name: str,
                        raise_what: str) -> None:
    """FieldError unless ``window`` is less than half of ``lease`` (either None: nothing
    to check); ``lease_name`` and ``raise_what`` word the message ("the TTL", "ttl")."""
    if window is not None and lease is not None and window * 2 >= lease:
        raise FieldError("safety_window",
                         f"'safety_window' must be less than half {lease_name} "
                         f"({lease / 2e9:g} s); raise {raise_what} or lower the window")


def check_path_name(field: str, value: str | None) -> None:
    """FieldError unless ``value`` (None: not set) can be one segment of a key path."""
    if value is not None and ("/" in value or not value):
        raise FieldError(field, f"'{field}' must be a non-empty name without '/', "
                         f"got {value!r}")
