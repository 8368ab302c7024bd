"""Run the ``flakekit`` command in-process and read what it printed."""

from __future__ import annotations

import io
from typing import Any

from flakekit.cli import main

__all__ = ["run_cli"]


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
