"""What the plugins bundled in this repository's ``plugins/`` provide, so a name they
register that is missing says which package to install instead of only "unknown".

The table is checked against the plugins themselves (tests/test_plugins.py): a bundled
plugin that registers a new name must be listed here.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BUNDLED", "install_hint"]

#: (kind, name) -> the distribution that registers it; kind "command" is a CLI command
BUNDLED: dict[tuple[str, str], str] = {
    ("allocator", "zookeeper"): "flakekit-zookeeper",
    ("membership", "zookeeper"): "flakekit-zookeeper",
    ("allocator", "etcd"): "flakekit-etcd",
    ("membership", "etcd"): "flakekit-etcd",
    ("command", "serve"): "flakekit-server",
}


def _checkout() -> Path | None:
    """The repository this flakekit runs from (an editable install), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "plugins").is_dir() and (root / "pyproject.toml").is_file() else None


def install_hint(kind: str, name: str) -> str:
    """``"; it comes with flakekit-etcd: pip install ./plugins/flakekit-etcd"`` (from a
    checkout; ``pip install flakekit-etcd`` otherwise), or "" when no bundled plugin has
    ``name``."""
    dist = BUNDLED.get((kind, name))
    if dist is None:
        return ""
    root = _checkout()
    if root is not None and (root / "plugins" / dist / "pyproject.toml").is_file():
        where = root / "plugins" / dist
        try:
            shown = f"./{where.relative_to(Path.cwd())}"
        except ValueError:
            shown = str(where)
        return f"; it comes with the plugin {dist}: pip install {shown}"
    return f"; it comes with the plugin {dist}: pip install {dist}"
