"""``flakekit --help`` and ``flakekit plugins`` start without importing SQLAlchemy: the
SQL adapters load when a command needs a database, not when the plugin host lists them."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import sys
from flakekit.cli import run, cli, _add_plugin_commands

def invoke():
    _add_plugin_commands()
    cli.main(args=sys.argv[1:], prog_name="flakekit", standalone_mode=False)

status = run(invoke)
print("\\n" + __import__("json").dumps({"status": status,
      "sqlalchemy": sorted(m for m in sys.modules if m.split(".")[0] == "sqlalchemy")[:3]}))
"""


def _probe(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_help_does_not_import_sqlalchemy() -> None:
    assert _probe("--help") == {"status": 0, "sqlalchemy": []}


def test_plugins_listing_does_not_import_sqlalchemy() -> None:
    assert _probe("plugins") == {"status": 0, "sqlalchemy": []}
