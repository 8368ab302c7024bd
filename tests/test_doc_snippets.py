"""Every code block of the docs runs (issue 14, item 2): a page's ```python blocks run in
document order in one fresh namespace (a page reads as one session), with the working
directory a new temporary directory and ``FLAKEKIT_STATE_DIR`` inside it; the lines of
```console / ```bash / ```sh blocks that start with ``flakekit`` (``$ flakekit`` in a
console block) run as commands in the same directory.

Markers, an HTML comment on the line before a block (invisible on the site):

* ``<!-- file: NAME -->``: the block is a file the later blocks use (``flakekit.toml``);
  it is written to the directory when the page's run reaches it.
* ``<!-- skip: why -->``: not runnable here (it needs a server, the network or an install);
  use sparingly.

A line with a placeholder (``flakekit COMMAND --help``, ``[--json]``) is a synopsis and
does not run. A command's exit status must be 0, or non-zero when the block shows ``error:``
as its output; a python block that defines ``test_*`` functions (a test module) has them
called; for ``flakekit layout`` and ``flakekit decode`` (deterministic) the output must
match the block's exactly. A command never prints a traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FLAKEKIT = Path(sys.executable).with_name("flakekit")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
MARKER = re.compile(r"<!--\s*(skip(?::[^>]*)?|file:\s*(\S+))\s*-->\s*$")
SHELLS = {"console", "bash", "sh", "shell"}
#: a placeholder (COMMAND, KEY, [--json]) makes a line a synopsis, not a command
SYNOPSIS = re.compile(r"(?<![\w$={-])[A-Z][A-Z_]+\b(?!=)|\[-")
#: output that is the same on every run and machine (the rest is checked by exit status)
EXACT = re.compile(r"^flakekit (layout (list|show|compose|decompose)|decode)\b")


@attrs.frozen
class Block:
    page: Path
    line: int
    lang: str
    text: str
    marker: str | None
    file: str | None

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    out = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARKER.search(before)
        out.append(Block(page, line, match.group(1), match.group(2),
                         mark.group(1).split(":")[0] if mark else None,
                         mark.group(2) if mark else None))
    return out


@attrs.frozen
class Command:
    line: str
    expected: list[str]


def commands(block: Block) -> list[Command]:
    """The flakekit commands of a shell block, each with the output shown under it."""
    out: list[Command] = []
    for raw in block.text.splitlines():
        line = raw.strip()
        if block.lang == "console":
            if line.startswith("$ "):
                cmd = line[2:].strip()
                out.append(Command(cmd, []) if cmd.startswith("flakekit") else Command("", []))
            elif out and out[-1].line:
                out[-1].expected.append(raw)
        elif line.startswith("flakekit"):
            out.append(Command(line, []))
    return [c for c in out if c.line and not SYNOPSIS.search(c.line)]


def _strip_comment(cmd: str) -> str:
    lexer = shlex.shlex(cmd, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return shlex.join(list(lexer))


def _normalise(text: str) -> str:
    return re.sub(r"\(\d+(\.\d+)? years left\)", "(N years left)", text.rstrip())


def runnable_pages() -> list[Path]:
    return [p for p in PAGES if any(
        b.marker != "skip" and (b.lang == "python" or (b.lang in SHELLS and commands(b)))
        for b in blocks(p))]


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _run_command(cmd: Command, block: Block, env: dict[str, str], cwd: Path) -> None:
    argv = shlex.split(_strip_comment(cmd.line))
    argv[0] = str(FLAKEKIT)
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    where = f"{block.where()}: `{cmd.line}`"
    assert "Traceback" not in output, f"{where} printed a traceback:\n{output}"
    shows_error = any(e.lstrip().startswith("error:") for e in cmd.expected)
    if shows_error:
        assert done.returncode != 0, f"{where}: the docs show an error, it exited 0:\n{output}"
    else:
        assert done.returncode == 0, f"{where}: exit {done.returncode}:\n{output}"
    if EXACT.match(cmd.line) and cmd.expected and "..." not in "\n".join(cmd.expected):
        assert _normalise(output) == _normalise("\n".join(cmd.expected)), (
            f"{where}: the docs show\n" + "\n".join(cmd.expected) + f"\nbut it prints\n{output}"
        )


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: p.name)
def test_page_snippets_run(page, tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "examples").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "flakekit.toml", work / "examples" / "flakekit.toml")
    state = tmp_path / "state"
    monkeypatch.setenv("FLAKEKIT_STATE_DIR", str(state))
    monkeypatch.delenv("FLAKEKIT_CONFIG", raising=False)
    # the example plugin's module, for the pages that show its tests (not its entry points)
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "flakekit-example-plugin"))
    env = {**os.environ, "FLAKEKIT_STATE_DIR": str(state), "COLUMNS": "200"}
    page_blocks = blocks(page)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    # a page may register schema components (docs/plugins.md does): keep them to the page
    from flakekit.sql import schema

    monkeypatch.setattr(schema, "_COMPONENTS", dict(schema._COMPONENTS))
    with _cwd(work):
        for block in page_blocks:
            if block.marker == "skip":
                continue
            if block.file:
                (work / block.file).write_text(block.text, encoding="utf-8")
            elif block.lang == "python":
                code = compile(block.text, block.where(), "exec")
                try:
                    exec(code, namespace)
                    for name, value in list(namespace.items()):  # a test module's tests
                        if name.startswith("test_") and callable(value):
                            namespace.pop(name)()
                except BaseException as exc:
                    raise AssertionError(f"{block.where()}: {type(exc).__name__}: {exc}") from exc
            elif block.lang in SHELLS:
                for cmd in commands(block):
                    _run_command(cmd, block, env, work)
        for value in list(namespace.values()):  # close what the page left open
            close = getattr(value, "close", None)
            if callable(close) and hasattr(value, "next_id"):
                with contextlib.suppress(Exception):
                    close()


def test_every_page_has_runnable_snippets_found():
    """The extractor sees the docs' code (guards against an empty parametrization)."""
    found = sum(1 for p in PAGES for b in blocks(p) if b.lang == "python")
    assert found >= 20 and len(runnable_pages()) >= 8


def test_help_ends_with_where_the_docs_are():
    from click.testing import CliRunner

    from flakekit.cli.main import cli

    result = CliRunner().invoke(cli, ["--help"], terminal_width=100)
    assert result.exit_code == 0
    tail = " ".join(result.output.split()[-20:])
    assert tail.endswith("shell completion: docs/cli.md.") and "docs/index.md" in tail
    assert "site/index.html" in tail and (ROOT / "docs" / "index.md").exists()


def test_mkdocs_nav_lists_every_page():
    """Every page of docs/ is in the site's nav (a page left out has no way in)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = set(re.findall(r":\s*(\S+\.md)\s*$", text, flags=re.M))
    # exclude_docs: files that are not pages (benchmarks-report.md is included by a page)
    block = re.search(r"^exclude_docs: \|\n((?:  \S.*\n)+)", text, flags=re.M)
    excluded = set(block.group(1).split()) if block else set()
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    pages -= excluded
    assert pages == nav, (pages - nav, nav - pages)
