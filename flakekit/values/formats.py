"""String forms of IDs: decimal, hex, base62, Crockford base32, each with an optional prefix.

Users pick UUIDv7/ULID largely for the string form; this gives flakekit's 64-bit IDs one.
The non-decimal encodings are **fixed width** (zero-padded to hold any 64-bit value) and
use alphabets in ASCII order, so sorting the strings bytewise sorts the IDs numerically.
Decimal stays unpadded by default (what every system prints); ``pad=True`` pads it to 20
digits. A prefix (``ord_``) tells a human, and :func:`detect`, what an ID is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from flakekit.errors import ConfigError, InvalidIdError, suggest

__all__ = ["DECIMAL", "ENCODINGS", "IdFormat", "StringIds", "detect", "parse_id"]

ID_BITS = 64
_MAX = (1 << ID_BITS) - 1
# ASCII order, so fixed-width strings sort like the numbers they encode
_ALPHABETS = {
    "decimal": "0123456789",
    "hex": "0123456789abcdef",
    "base62": "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    "base32": "0123456789ABCDEFGHJKMNPQRSTVWXYZ",  # Crockford: no I, L, O, U
}
ENCODINGS = tuple(_ALPHABETS)
_ALIASES = {"dec": "decimal", "crockford": "base32", "base32-crockford": "base32"}
# Crockford decoding is case-insensitive and reads I/L as 1 and O as 0
_CROCKFORD_EXTRA = {"I": 1, "L": 1, "O": 0}
_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_]*_$")
_SPLIT = re.compile(r"^(?P<prefix>[A-Za-z][A-Za-z0-9_]*_)?(?P<body>[^_]+)$")


def _width(encoding: str) -> int:
    base, width = len(_ALPHABETS[encoding]), 0
    while base**width <= _MAX:
        width += 1
    return width


_WIDTHS = {name: _width(name) for name in ENCODINGS}  # decimal 20, hex 16, base62 11, base32 13


def _digit_tables() -> dict[str, dict[str, int]]:
    """Character -> digit value per encoding, with what each also reads: upper-case hex,
    and Crockford's lower case and look-alikes (I and L are 1, O is 0)."""
    tables = {name: {ch: i for i, ch in enumerate(abc)} for name, abc in _ALPHABETS.items()}
    tables["hex"].update({ch.upper(): i for ch, i in tables["hex"].items()})
    crockford = tables["base32"]
    crockford.update({**_CROCKFORD_EXTRA, **{ch.lower(): i for ch, i in crockford.items()}})
    crockford.update({ch.lower(): i for ch, i in _CROCKFORD_EXTRA.items()})
    return tables


_DIGITS = _digit_tables()


def _encoding(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(path, f"expected one of {', '.join(ENCODINGS)}, got {value!r}")
    name = _ALIASES.get(value.lower(), value.lower())
    if name not in _ALPHABETS:
        raise ConfigError(
            path, f"unknown encoding {value!r}; known: {', '.join(ENCODINGS)}"
            f"{suggest(value.lower(), ENCODINGS)}"
        )
    return name


def _format_encoding(value: object) -> str:
    return _encoding(value, "format.encoding")


@attrs.frozen
class IdFormat:
    """How an ID is written as a string.

    Attributes:
        encoding: ``decimal`` (default), ``hex``, ``base62`` or ``base32`` (Crockford).
        prefix: put before the digits, e.g. ``ord_``: letters, digits and ``_``, starting
            with a letter and ending with ``_`` (so the digits can always be told apart).
        pad: zero-pad to the fixed width that holds any 64-bit ID (sortable strings).
            Default: on for hex, base62 and base32, off for decimal.
    """

    encoding: str = attrs.field(default="decimal", converter=_format_encoding)
    prefix: str = ""
    pad: bool | None = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.prefix, str) or (self.prefix and not _PREFIX.match(self.prefix)):
            raise ConfigError(
                "format.prefix", f"{self.prefix!r} is not a valid prefix: use letters, digits "
                "and '_', starting with a letter and ending with '_' (e.g. 'ord_')"
            )
        if self.pad is None:
            object.__setattr__(self, "pad", self.encoding != "decimal")
        elif not isinstance(self.pad, bool):
            raise ConfigError("format.pad", f"expected true or false, got {self.pad!r}")

    @classmethod
    def from_config(cls, value: Any, path: str = "format") -> IdFormat:
        """``"base62"``, or a table ``{encoding = "base62", prefix = "ord_", pad = true}``;
        ``None`` is decimal. Errors name ``path``."""
        if value is None:
            return DECIMAL
        if isinstance(value, IdFormat):
            return value
        if isinstance(value, str):
            value = {"encoding": value}
        if not isinstance(value, Mapping):
            raise ConfigError(
                path, f'expected an encoding name or a table such as {{encoding = "base62", '
                f'prefix = "ord_"}}, got {value!r}'
            )
        known = {"encoding", "prefix", "pad"}
        for key in value:
            if key not in known:
                raise ConfigError(f"{path}.{key}", f"unknown key; known keys: "
                                  f"{', '.join(sorted(known))}{suggest(key, known)}")
        try:
            return cls(value.get("encoding", "decimal"), value.get("prefix", ""), value.get("pad"))
        except ConfigError as exc:  # re-root "format.x" at the config path
            field = exc.path.partition(".")[2]
            raise ConfigError(f"{path}.{field}", exc.message) from None

    @property
    def width(self) -> int | None:
        """The number of digits every ID gets (None: unpadded decimal)."""
        return _WIDTHS[self.encoding] if self.pad else None

    @property
    def sortable(self) -> bool:
        """Whether string order equals numeric order (fixed width)."""
        return bool(self.pad)

    def encode(self, value: int) -> str:
        """The string form of ``value`` (0 <= value < 2**64)."""
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX:
            raise InvalidIdError(f"id must be an integer in 0..2**64-1, got {value!r}")
        alphabet = _ALPHABETS[self.encoding]
        base = len(alphabet)
        digits = []
        while value:
            value, rest = divmod(value, base)
            digits.append(alphabet[rest])
        body = "".join(reversed(digits)) or "0"
        if self.pad:
            body = body.rjust(_WIDTHS[self.encoding], "0")
        return self.prefix + body

    def encode_many(self, values: Iterable[int]) -> list[str]:
        return [self.encode(v) for v in values]

    def decode(self, text: str) -> int:
        """The ID a string of this format stands for; :class:`InvalidIdError` says what is
        wrong (missing prefix, a character outside the alphabet, the wrong length for a
        fixed-width form, too big)."""
        if not isinstance(text, str):
            raise InvalidIdError(f"expected a string, got {text!r}")
        raw = text.strip()
        body = raw
        if self.prefix:
            if not raw.startswith(self.prefix):
                found = _SPLIT.match(raw)
                got = found.group("prefix") if found and found.group("prefix") else None
                raise InvalidIdError(
                    f"id {raw!r}: expected the prefix {self.prefix!r}"
                    + (f", got {got!r}" if got else "")
                )
            body = raw[len(self.prefix):]
        what = f"{self.encoding} id {raw!r}"
        if not body:
            raise InvalidIdError(f"{what}: no digits after the prefix")
        digits = _DIGITS[self.encoding]
        value, base = 0, len(_ALPHABETS[self.encoding])
        for pos, ch in enumerate(body):
            digit = digits.get(ch)
            if digit is None:
                raise InvalidIdError(
                    f"{what}: {ch!r} at position {pos + 1} is not a {self.encoding} digit "
                    f"({_describe(self.encoding)})"
                )
            value = value * base + digit
        width = _WIDTHS[self.encoding]
        if len(body) > width:
            raise InvalidIdError(f"{what}: {len(body)} digits, at most {width} for a 64-bit id")
        if self.pad and self.encoding != "decimal" and len(body) != width:
            # a fixed-width string one character short is another valid ID: refuse it
            raise InvalidIdError(
                f"{what}: {len(body)} characters, expected exactly {width} "
                f"({self.expected_form()})"
            )
        if value > _MAX:
            raise InvalidIdError(f"{what}: {value} does not fit in 64 bits")
        return value

    def expected_form(self) -> str:
        """What a string of this format looks like, for error messages."""
        width = (f"exactly {_WIDTHS[self.encoding]} " if self.pad and self.encoding != "decimal"
                 else "")
        head = f"{self.prefix!r} then " if self.prefix else ""
        return f"{head}{width}{self.encoding} characters: {_describe(self.encoding)}"

    def __str__(self) -> str:
        return f"{self.prefix}<{self.encoding}>" if self.prefix else self.encoding


DECIMAL = IdFormat()


def _describe(encoding: str) -> str:
    return {
        "decimal": "0-9", "hex": "0-9, a-f",
        "base62": "0-9, A-Z, a-z", "base32": "Crockford: 0-9 and A-Z without I, L, O, U",
    }[encoding]


def detect(text: str) -> IdFormat:
    """Guess the format of an ID string: an optional ``prefix_``, then all digits (decimal),
    ``0x`` + hex, or exactly 16 hex / 11 base62 / 13 base32 characters (the fixed widths).
    An all-digit body is read as decimal: pass the format to be sure."""
    raw = text.strip()
    found = _SPLIT.match(raw)
    if found is None:
        raise InvalidIdError(f"id {raw!r} is not an integer or an id string ({_FORMS})")
    prefix, body = found.group("prefix") or "", found.group("body")
    if body.isdigit() and body.isascii():
        return IdFormat("decimal", prefix)
    fixed = _fixed_width(raw)
    if fixed is not None:
        return fixed
    raise InvalidIdError(f"id {raw!r} is not an integer or an id string ({_FORMS}); "
                         "name the format (e.g. --format base62)")


def _fixed_width(raw: str) -> IdFormat | None:
    """The string form whose exact width and alphabet ``raw`` (after a prefix) has."""
    found = _SPLIT.match(raw)
    if found is None:
        return None
    prefix, body = found.group("prefix") or "", found.group("body")
    for encoding in ("hex", "base62", "base32"):
        if len(body) == _WIDTHS[encoding] and all(ch in _DIGITS[encoding] for ch in body):
            return IdFormat(encoding, prefix)
    return None


_FORMS = ("decimal, 0x-hex, or an optional prefix_ and 16 hex, 11 base62 or 13 Crockford "
          "base32 characters")


def parse_id(text: str, fmt: IdFormat | None = None) -> int:
    """An ID from a string: decimal or ``0x`` hex always work; otherwise ``fmt`` (its prefix
    may be left out), or the format :func:`detect` finds."""
    raw = text.strip()
    low = raw.lower()
    # "0x" reads as hex unless the whole string is a fixed-width string form: base62 and
    # Crockford base32 bodies may start with 0x / 0X themselves ("0X0000000000G")
    if low.startswith("0x") and (
        _fixed_width(raw) is None or (fmt is not None and fmt.encoding in ("decimal", "hex"))
    ):
        try:
            return int(raw, 16)
        except ValueError:
            raise InvalidIdError(f"id {raw!r} is not a valid 0x-hex integer") from None
    if fmt is None:
        return detect(raw).decode(raw)
    if raw.isdigit() and raw.isascii() and (
        (fmt.prefix and not raw.startswith(fmt.prefix)) or len(raw) > (fmt.width or 99)
    ):
        return int(raw)  # a plain decimal ID where string forms are expected
    if not fmt.prefix:
        found = _SPLIT.match(raw)
        if found and found.group("prefix"):  # auto-detect the prefix the user left in
            fmt = attrs.evolve(fmt, prefix=found.group("prefix"))
    return fmt.decode(raw)


class StringIds:
    """``next_str()`` / ``next_strs(n)`` for a generator: its IDs in its configured string
    form (``format = {encoding = "base62", prefix = "ord_"}``; default decimal)."""

    id_format: IdFormat = DECIMAL

    def next_str(self: Any) -> str:
        """The next ID as a string of :attr:`id_format`."""
        return str(self.id_format.encode(self.next_id()))

    def next_strs(self: Any, n: int) -> list[str]:
        """``n`` IDs as strings (one ``next_ids(n)`` batch)."""
        return list(self.id_format.encode_many(self.next_ids(n)))
