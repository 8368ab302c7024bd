"""The installed distribution registers through the `flakekit` entry-point group."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_flakekit_plugins_lists_the_zookeeper_allocator():
    """`flakekit plugins` (the console script) shows the plugin, its distribution and
    the `zookeeper` allocator it registers."""
    script = Path(sys.executable).with_name("flakekit")
    out = subprocess.run([str(script), "plugins", "--json"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    plugin = next(p for p in json.loads(out) if p["name"] == "zookeeper")
    assert plugin["distribution"] == "flakekit-zookeeper" and not plugin["builtin"]
    assert "allocator:zookeeper" in plugin["registers"]
