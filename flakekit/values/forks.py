"""After ``fork()``: tell every live object that its process is a child now.

A forked child inherits its parent's generators, leases and connections. Using them
would repeat the parent's IDs or share its sockets, so each kind of object registers a
method to run in the child. One ``os.register_at_fork`` hook serves them all.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["after_fork_in_child"]

_LIVE: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def after_fork_in_child(obj: Any, method: Callable[[Any], None]) -> None:
    """Call ``method(obj)`` in a forked child for as long as ``obj`` is alive."""
    _LIVE[obj] = method


def _run_in_child() -> None:
    for obj, method in list(_LIVE.items()):
        method(obj)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_run_in_child)
