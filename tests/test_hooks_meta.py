"""Meta-test (datasette's ``test_plugin_hooks_have_tests``): every hook in
flakekit/pluginhost/hookspecs.py is exercised by a test, and documented in docs/hooks.md
(the signature check is tests/test_docs.py).

"Exercised" means a test file (tests/, plugins/*/tests/) implements the hook in a plugin it
loads (``def flakekit_...(``) or calls it through the host (``hook.flakekit_...(``). A new
hook without either fails here, naming what to add.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from flakekit.pluginhost import hookspecs

ROOT = Path(__file__).resolve().parent.parent
META = {Path(__file__).resolve(), ROOT / "tests" / "test_docs.py"}  # name hooks, test none
HOOKS = sorted(name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
               if name.startswith("flakekit_"))


def _test_sources() -> dict[Path, str]:
    files = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("plugins/*/tests/**/*.py")]
    return {f: f.read_text(encoding="utf-8") for f in files if f.resolve() not in META}


SOURCES = _test_sources()


def test_hooks_and_tests_found():
    """Guards against an empty parametrization (a moved hookspecs module, a moved tests/)."""
    assert len(HOOKS) >= 10 and len(SOURCES) >= 20


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test(hook):
    """Some test implements or calls the hook."""
    use = re.compile(rf"\bdef {hook}\(|\bhook\.{hook}\(")
    users = sorted(str(f.relative_to(ROOT)) for f, text in SOURCES.items() if use.search(text))
    assert users, (
        f"no test exercises {hook}: add a test whose plugin implements it "
        f"(`@hookimpl def {hook}(...)`, loaded with PluginHost().load(extra=[...])) or that "
        f"calls `host.hook.{hook}(...)`"
    )


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_doc_section_with_an_example(hook):
    """docs/hooks.md has a section for the hook with a Python example implementing it."""
    text = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.M)
    matching = [s for s in sections if s.strip("`").startswith(f"{hook}(")]
    assert matching, f"docs/hooks.md needs a section '## {hook}(...)'"
    blocks = re.findall(r"```python\n(.*?)```", matching[0], flags=re.S)
    assert any(re.search(rf"\bdef {hook}\(", b) for b in blocks), (
        f"docs/hooks.md section {hook}: add a ```python example with `def {hook}(...)`"
    )


def test_no_documented_hook_is_stale():
    """Every hook heading in docs/hooks.md names a hook that exists."""
    text = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
    documented = re.findall(r"^## `?(flakekit_\w+)\(", text, flags=re.M)
    assert documented and sorted(set(documented) - set(HOOKS)) == []
