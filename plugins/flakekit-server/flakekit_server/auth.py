"""Bearer tokens per generator.

A token file has one ``GENERATOR TOKEN`` pair per line (``#`` starts a comment). ``*``
stands for every generator. A generator may have several tokens (to rotate them). A
generator with no token (and no ``*`` line) is open, as Leaf's endpoints are.

Only the endpoints that issue IDs are protected; health, readiness, metrics, decode and
the monitor page issue nothing (which is one reason the server binds 127.0.0.1 unless
told otherwise).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from pathlib import Path

from flakekit.plugin import ConfigError, suggest

__all__ = ["MIN_TOKEN_LENGTH", "Tokens", "load_tokens"]

#: shorter tokens are refused: they can be guessed
MIN_TOKEN_LENGTH = 16
_TOKEN_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")


class Tokens:
    """Which bearer tokens open which generator."""

    def __init__(self, by_generator: Mapping[str, Iterable[bytes]] | None = None) -> None:
        self._by: dict[str, tuple[bytes, ...]] = {
            name: tuple(tokens) for name, tokens in (by_generator or {}).items()
        }

    def __bool__(self) -> bool:
        return bool(self._by)

    def protected(self, generator: str) -> bool:
        """True if requests for ``generator`` need a token."""
        return generator in self._by or "*" in self._by

    def allows(self, generator: str, authorization: bytes | None) -> bool:
        """True if the ``Authorization`` header value opens ``generator``."""
        wanted = self._by.get(generator, ()) + self._by.get("*", ())
        if not wanted:
            return True
        if not authorization:
            return False
        scheme, _, token = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        token = token.strip()
        ok = False
        for candidate in wanted:  # compare with every one: no early exit to time
            ok |= hmac.compare_digest(candidate, token)
        return ok


def load_tokens(path: str | Path | None, generators: Iterable[str]) -> Tokens:
    """Read a token file; every error names the file, the line and the fix.

    Raises:
        ConfigError: unreadable file, malformed line, unknown generator, weak token.
    """
    if path is None:
        return Tokens()
    known = list(generators)
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("--token-file", f"cannot read {str(file)!r}: {exc.strerror}") from None
    by: dict[str, list[bytes]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"--token-file {file}:{number}"
        parts = line.split()
        if len(parts) != 2:
            raise ConfigError(where,
                              "expected 'GENERATOR TOKEN' (or '* TOKEN' for every generator)")
        name, token = parts
        if name != "*" and name not in known:
            raise ConfigError(
                where, f"unknown generator {name!r}; known: {', '.join(sorted(known)) or '(none)'}"
                f"{suggest(name, known)}"
            )
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(
                where, f"the token for {name!r} is too short ({len(token)} characters); use at "
                f"least {MIN_TOKEN_LENGTH}, e.g. from `python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`"
            )
        if not set(token) <= _TOKEN_CHARS:
            raise ConfigError(where,
                              f"the token for {name!r} has characters a bearer token cannot carry")
        by.setdefault(name, []).append(token.encode("ascii"))
    return Tokens(by)
