"""``flakekit plugin new NAME``: write a plugin skeleton that installs, registers and tests.

The files come from ``templates/*.tmpl`` (package data, so they ship in the wheel),
filled with :class:`string.Template`. The skeleton imports only from ``flakekit`` and
``flakekit.plugin`` and pins the core to the running minor release, the range within
which that surface is stable.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import TYPE_CHECKING

import click

from flakekit.__about__ import __version__
from flakekit.cli.main import cli
from flakekit.errors import ConfigError

if TYPE_CHECKING:  # pathlib and string when a skeleton is written: --help needs neither
    from pathlib import Path

__all__ = ["core_range", "write_skeleton"]

_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")

#: template -> path inside the new plugin's directory
_FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "__init__.py.tmpl": "{module}/__init__.py",
    "test_plugin.py.tmpl": "tests/test_{ident}.py",
    "README.md.tmpl": "README.md",
    "LICENSE.tmpl": "LICENSE",
}


def core_range(version: str = __version__) -> tuple[str, str]:
    """``("X.Y", "X.Y+1")`` for ``flakekit>=X.Y,<X.Y+1``."""
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return f"{major}.{minor}", f"{major}.{minor + 1}"


def write_skeleton(name: str, parent: Path) -> Path:
    """Write ``parent/flakekit-NAME/`` and return it; refuses a bad name or an existing
    directory (:class:`ConfigError`: one line, exit 2)."""
    if not _NAME.fullmatch(name):
        raise ConfigError("NAME", f"{name!r}: use lowercase letters, digits and single dashes, "
                          "starting with a letter (e.g. 'acme' or 'acme-ids')")
    target = parent / f"flakekit-{name}"
    if target.exists():
        raise ConfigError("--dir", f"{target} already exists; pick another NAME or --dir")
    ident = name.replace("-", "_")
    core_min, core_max = core_range()
    values = {"name": name, "dist": f"flakekit-{name}", "module": f"flakekit_{ident}",
              "core_min": core_min, "core_max": core_max, "year": str(dt.date.today().year)}
    import string
    from importlib import resources  # not at import: `flakekit --help` needs no templates

    templates = resources.files("flakekit.cli") / "templates"
    for template, relative in _FILES.items():
        path = target / relative.format(module=values["module"], ident=ident)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = (templates / template).read_text(encoding="utf-8")
        path.write_text(string.Template(text).substitute(values), encoding="utf-8")
    return target


@cli.group("plugin")
def plugin_group() -> None:
    """Start a plugin of your own."""


@plugin_group.command("new")
@click.argument("name")
@click.option("--dir", "parent", type=click.Path(file_okay=False), default=".",
              show_default=True, help="Where to create flakekit-NAME/.")
def plugin_new(name: str, parent: str) -> None:
    """Write flakekit-NAME/: a plugin registering a NAME layout and a NAME clock, with its
    pyproject.toml (entry point, core range), README, MIT LICENSE and tests that use
    flakekit.testing."""
    from pathlib import Path

    target = write_skeleton(name, Path(parent))
    shown = str(target) if target.is_absolute() else f"./{target}"  # pip: a path, not a name
    click.echo(f"wrote {shown}/ -- next: pip install -e '{shown}[test]' && "
               f"flakekit plugins && pytest {shown}")
