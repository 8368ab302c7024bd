"""A ``plugin_host`` fixture for a plugin's test module: a plugin host of the test's own
with every installed plugin loaded, for tests that build a kit through a plugin's
registered name::

    plugin_host = plugin_host_fixture()

Needs pytest.
"""

from __future__ import annotations

from typing import Any

import pytest

from flakekit.pluginhost.host import PluginHost

__all__ = ["plugin_host_fixture"]


def plugin_host_fixture() -> Any:
    """A fixture returning a freshly loaded plugin host (no state shared between tests)."""

    @pytest.fixture
    def fixture() -> PluginHost:
        return PluginHost().load()

    return fixture
