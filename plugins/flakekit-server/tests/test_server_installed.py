"""The installed distribution adds `flakekit serve` through the CLI hook."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("flakekit")


def test_serve_command_and_plugin_listing():
    """`flakekit --help` lists `serve`, and `flakekit plugins` names the distribution."""
    help_text = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True,
                               timeout=60, check=True).stdout
    assert "serve" in help_text
    out = subprocess.run([str(SCRIPT), "plugins", "--json"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    plugin = next(p for p in json.loads(out) if p["name"] == "server")
    assert plugin["distribution"] == "flakekit-server"
    assert "flakekit_register_commands" in plugin["hooks"]
