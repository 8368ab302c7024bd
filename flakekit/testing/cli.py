"""Run the ``flakekit`` command in-process and read what it printed."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import Any

from flakekit.cli import main

__all__ = ["run_cli", "run_error_line", "run_ok", "run_refused", "write_segment_toml",
           "write_sql_toml", "write_toml"]


def run_cli(capsys: Any, *args: str, stdin: str | None = None,
            monkeypatch: Any = None) -> tuple[int, str, str]:
    """``flakekit ARGS...`` → (exit status, stdout, stderr), with pytest's ``capsys``.

    ``stdin`` (with ``monkeypatch``) feeds standard input, e.g. ``decode -``.
    """
    if stdin is not None:
        if monkeypatch is None:
            raise TypeError("run_cli(stdin=...) needs monkeypatch=")
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    try:
        main(list(args))
    except SystemExit as exc:
        code = exc.code
    else:  # pragma: no cover - main always exits
        code = 0
    out, err = capsys.readouterr()
    status = code if isinstance(code, int) else (0 if code is None else 1)
    return status, out, err


def write_toml(directory: Path, text: str, name: str = "flakekit.toml") -> Path:
    """Write ``text`` (dedented, so an indented triple-quoted string reads as TOML) to
    ``directory / name`` and return that path, e.g. for ``run_cli(capsys, "next", "-c",
    str(path))``."""
    path = Path(directory) / name
    path.write_text(textwrap.dedent(text))
    return path


def write_segment_toml(directory: Path, url: str, generator: str, settings: str = "") -> Path:
    """:func:`write_toml` of the smallest segment config: backend ``default`` on ``url``
    and segment generator ``generator`` (its store: that backend's ``leaf_alloc``), with
    ``settings`` (TOML lines of that generator's table) added."""
    return write_toml(directory, textwrap.dedent(f"""
        [backends.default]
        url = "{url}"
        [generators.{generator}]
        strategy = "segment"
    """) + textwrap.dedent(settings) + "\n")


def write_sql_toml(directory: Path, url: str) -> Path:
    """:func:`write_segment_toml` of segment generator ``invoice`` (key ``invoice``), plus
    snowflake generator ``orders`` leasing its worker id on the same backend (service
    ``orders``): both kinds of SQL-backed generator on one database."""
    return write_segment_toml(directory, url, "invoice", """
        [generators.orders]
        allocator = { type = "sql", service = "orders" }
    """)


def run_ok(capsys: Any, *args: str, **kw: Any) -> str:
    """:func:`run_cli` for a command that must succeed: asserts exit status 0 (the message
    shows stderr) and returns stdout."""
    code, out, err = run_cli(capsys, *args, **kw)
    assert code == 0, f"flakekit {' '.join(args)}: exit {code}\n{err}"
    return out


def run_refused(capsys: Any, *args: str, code: int = 2, **kw: Any) -> str:
    """:func:`run_cli` for a command that must fail with exit status ``code`` (default 2:
    a usage or config error); returns stderr, for the checks of what the user is told."""
    status, out, err = run_cli(capsys, *args, **kw)
    assert status == code, f"flakekit {' '.join(args)}: exit {status}, not {code}\n{out}{err}"
    return err


def run_error_line(capsys: Any, *args: str, code: int = 2, **kw: Any) -> str:
    """:func:`run_refused` that also holds the command to what a refusal owes its user:
    nothing on stdout, one line on stderr (returned, with its newline)."""
    status, out, err = run_cli(capsys, *args, **kw)
    assert (status, out) == (code, ""), f"flakekit {' '.join(args)}: exit {status}\n{out}{err}"
    assert err.count("\n") == 1, err
    return err
