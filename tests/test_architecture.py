"""The tree shows the architecture: lower layers never import higher ones, and plugins
import only the stable surface.

Layers, lowest first (DESIGN.md §7). An import inside ``if TYPE_CHECKING:`` is only for
annotations and does not count; an import inside a function does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flakekit"

#: module prefix -> layer; the longest matching prefix wins
LAYERS = {
    "flakekit.__about__": 0,
    "flakekit._lazy": 0,         # the lazy re-export helper of the public modules
    "flakekit.errors": 0,
    "flakekit.values": 1,
    "flakekit.leases": 2,
    "flakekit.generators": 3,
    "flakekit.cluster": 4,      # membership, ownership, strict keys (over leases, generators)
    "flakekit.sql": 5,
    "flakekit.pluginhost": 6,
    "flakekit.assembly": 7,
    "flakekit.cli": 8,
    "flakekit.builtin": 9,
    "flakekit.plugin": 10,
    "flakekit.embed": 10,        # what the server needs to embed flakekit
    "flakekit.api": 10,
    "flakekit.testing": 10,
    "flakekit.aio": 10,          # integrations: on top, beside api.py
    "flakekit.sqlalchemy": 10,
    "flakekit.client": 10,       # the HTTP client library (sync and asyncio)
    "flakekit.aio_client": 10,
    "flakekit": 11,   # the package's __init__: the public API
}

#: (importer, imported) pairs that break the order today; each is a known debt with an
#: issue, and the list only ever shrinks
KNOWN: set[tuple[str, str]] = set()


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_lines(tree)
    found = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", 0) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from flakekit import x` where x is a submodule
            for a in node.names:
                if (PACKAGE.parent / (node.module.replace(".", "/") + "/" + a.name)).exists() or \
                        (PACKAGE.parent / (node.module.replace(".",
                                                               "/") + f"/{a.name}.py")).exists():
                    found.append((node.lineno, f"{node.module}.{a.name}"))
    return [(n, m) for n, m in found if m == "flakekit" or m.startswith("flakekit.")]


def core_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_lower_layers_never_import_higher_ones():
    """Every import inside flakekit/ goes down (or sideways within one layer)."""
    wrong = []
    for path in core_modules():
        me = module_name(path)
        for lineno, target in imports(path):
            if target == "flakekit" and me != "flakekit":
                continue   # `from flakekit import hookimpl`-style re-exports resolve lower
            if layer(target) > layer(me) and (me, target) not in KNOWN:
                wrong.append(f"{path.relative_to(ROOT)}:{lineno}: {me} (layer {layer(me)}) "
                             f"imports {target} (layer {layer(target)})")
    assert not wrong, "\n".join(wrong)


def test_known_debts_are_still_real():
    """An allow-listed pair that no longer occurs must leave the list."""
    seen = {(module_name(p), t) for p in core_modules() for _, t in imports(p)}
    assert not KNOWN - seen, KNOWN - seen


PLUGIN_SOURCES = sorted(
    p for d in [*(ROOT / "plugins").glob("*/flakekit_*"), *(ROOT / "examples").glob("*/flakekit_*")]
    for p in d.rglob("*.py")
)


@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_import_only_the_stable_surface(path):
    """Bundled plugins import `flakekit`, `flakekit.plugin` and `flakekit.embed`, nothing deeper."""
    deep = [f"{path.relative_to(ROOT)}:{n}: {m}" for n, m in imports(path)
            if m not in ("flakekit", "flakekit.plugin", "flakekit.embed")]
    assert not deep, "\n".join(deep)


SURFACES = ["flakekit", "flakekit.plugin", "flakekit.embed"]


@pytest.mark.parametrize("module", SURFACES)
def test_surface_names_resolve(module):
    """Every name a public module promises can be imported, and lives where its table says."""
    import importlib

    surface = importlib.import_module(module)
    for name in surface.__all__:
        assert getattr(surface, name) is not None, name
    for name, where in surface._WHERE.items():
        assert getattr(surface, name) is getattr(importlib.import_module(where), name), name
    assert set(dir(surface)) == set(surface.__all__)


@pytest.mark.parametrize("module", SURFACES)
def test_surface_type_checking_imports_match_the_table(module):
    """What mypy reads (the `if TYPE_CHECKING:` imports) is exactly the lazy table."""
    import importlib

    surface = importlib.import_module(module)
    tree = ast.parse(Path(surface.__file__).read_text())
    lines = _type_checking_lines(tree)
    typed = {a.asname or a.name: node.module for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.lineno in lines for a in node.names}
    assert typed == surface._WHERE


def test_plugin_surface_keeps_the_moved_embedding_names():
    """Names that moved to flakekit.embed still import from flakekit.plugin, unadvertised."""
    import flakekit.embed
    import flakekit.plugin

    for name in flakekit.embed.__all__:
        assert getattr(flakekit.plugin, name) is getattr(flakekit.embed, name), name
        assert name not in flakekit.plugin.__all__, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = flakekit.plugin.nope


def test_every_folder_says_what_it_holds():
    """Each package of the tree has a docstring saying what lives there."""
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 40, f"{init.relative_to(ROOT)} needs a docstring"
