"""Filling a plugin's attrs settings class from a config table, with clear errors."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from flakekit.errors import ConfigError, LayoutError, suggest

__all__ = ["build_settings", "check_keys"]

T = TypeVar("T")
_SIMPLE = {int: "an integer", str: "a string", float: "a number", bool: "true or false"}


def check_keys(table: Mapping[str, Any], known: set[str] | list[str], path: str) -> None:
    """Reject keys that are not in ``known``, suggesting the nearest one."""
    for key in table:
        if key not in known:
            raise ConfigError(
                f"{path}.{key}" if path else key,
                f"unknown key; known keys: {', '.join(sorted(known)) or '(none)'}"
                f"{suggest(key, known)}",
            )


@typing.overload
def build_settings(cls: type[T], table: Mapping[str, Any], path: str) -> T: ...
@typing.overload
def build_settings(cls: None, table: Mapping[str, Any], path: str) -> None: ...


def build_settings(cls: type[T] | None, table: Mapping[str, Any], path: str) -> T | None:
    """``cls(**table)`` with each problem reported as ``path.field: what to do``."""
    if cls is None:
        check_keys(table, set(), path)
        return None
    klass: Any = cls
    attrs.resolve_types(klass)
    fields = {f.alias or f.name: f for f in attrs.fields(klass) if f.init}
    check_keys(table, set(fields), path)
    for name, field in fields.items():
        if name in table:
            value = table[name]
            expected = _simple_type(field.type) if field.converter is None else None
            if expected is not None and not _is(value, expected):
                raise ConfigError(f"{path}.{name}", f"expected {_SIMPLE[expected]}, got {value!r}")
            _check_field(field, value, f"{path}.{name}")
        elif field.default is attrs.NOTHING:
            raise ConfigError(f"{path}.{name}", "is required")
    try:
        return cls(**table)
    except ConfigError:
        raise
    except LayoutError as exc:
        raise ConfigError(f"{path}.{exc.field}", str(exc).split(": ", 1)[-1]) from None
    except (ValueError, TypeError) as exc:
        field_name = _field_in(str(exc), fields) or ""
        where = f"{path}.{field_name}" if field_name else path
        raise ConfigError(where, _clean(str(exc))) from None


def _check_field(field: Any, value: Any, where: str) -> None:
    """Run one field's converter and validator now, so an error names that field."""
    try:
        if field.converter is not None:
            value = field.converter(value)
        if field.validator is not None:
            field.validator(None, field, value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(where, _clean(str(exc))) from None
    except AttributeError:  # a validator that needs the other fields: checked below
        pass


def _simple_type(annotation: Any) -> type | None:
    """int, str, float or bool for ``T`` and ``T | None``; None for anything else."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1:
        annotation = args[0]
    return annotation if annotation in _SIMPLE else None


def _is(value: Any, expected: type) -> bool:
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def _field_in(message: str, fields: Mapping[str, Any]) -> str | None:
    for name in fields:
        if (f"'{name}'" in message or message.startswith((f"{name}:", f"{name} "))
                or f" {name} " in message):
            return name
    return None


def _clean(message: str) -> str:
    # attrs validators say "'x' must be <class 'int'> (got ...)": keep it short
    return message.replace("<class '", "").replace("'>", "")
