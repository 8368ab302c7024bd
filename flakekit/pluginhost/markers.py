"""The pluggy markers of project ``flakekit``: specs here, implementations anywhere.

A module of its own (importing nothing of flakekit) so a plugin or a built-in can take
``hookimpl`` without importing the package's public API first.
"""

from __future__ import annotations

import pluggy

__all__ = ["PROJECT", "hookimpl", "hookspec"]

PROJECT = "flakekit"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
