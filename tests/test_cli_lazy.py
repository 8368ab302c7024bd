"""``flakekit --help`` and ``flakekit plugins`` start without importing SQLAlchemy: the
SQL adapters load when a command needs a database, not when the plugin host lists them.
A built-in command (``decode``) imports no plugin's command module (issue 24)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import sys
from flakekit.cli import run, cli

def invoke():
    cli.main(args=sys.argv[1:], prog_name="flakekit", standalone_mode=False)

status = run(invoke)
print("\\n" + __import__("json").dumps({"status": status,
      "sqlalchemy": sorted(m for m in sys.modules if m.split(".")[0] == "sqlalchemy")[:3],
      "plugin_cli": sorted(m for m in sys.modules if m in PLUGIN_CLI)}))
"""
#: modules that only the plugins' flakekit_register_commands hooks import
PLUGIN_CLI = ("flakekit_server.cli", "flakekit_redis.cli", "flakekit.builtin.sql",
              "flakekit.builtin.segments")
PROBE = f"PLUGIN_CLI = {PLUGIN_CLI!r}\n" + PROBE


def _probe(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_help_does_not_import_sqlalchemy() -> None:
    result = _probe("--help")
    assert (result["status"], result["sqlalchemy"]) == (0, [])
    assert {"flakekit.builtin.sql", "flakekit.builtin.segments"} <= set(result["plugin_cli"])


def test_plugins_listing_does_not_import_sqlalchemy() -> None:
    result = _probe("plugins")
    assert (result["status"], result["sqlalchemy"]) == (0, [])


def test_builtin_command_does_not_load_plugin_commands() -> None:
    """``decode`` is built in: no plugin's command hook runs, none of their modules load."""
    assert _probe("decode", "1234567890123456789") == {
        "status": 0, "sqlalchemy": [], "plugin_cli": []}


def test_plugin_command_is_found_when_asked_for() -> None:
    """``db --help`` (a built-in plugin's command) adds the plugins' commands first."""
    result = _probe("db", "--help")
    assert result["status"] == 0 and "flakekit.builtin.sql" in result["plugin_cli"]


def test_plugin_subcommand_of_a_builtin_group_is_found() -> None:
    """``workers release`` (``flakekit.builtin.sql`` adds it to the built-in ``workers``
    group) is found though ``workers`` itself resolves without the plugins' commands."""
    result = _probe("workers", "release", "--help")
    assert result["status"] == 0 and "flakekit.builtin.sql" in result["plugin_cli"]
