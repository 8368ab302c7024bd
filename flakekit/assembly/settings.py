"""Filling a plugin's attrs settings class from a config table, with clear errors.

References to other plugins (``clock = "monotonic"``, ``allocator = {type = "sql", ...}``,
``store = ...``) are declared with :func:`plugin_ref` and parsed here, once, into a
:class:`PluginRef`; nothing downstream re-reads ``table["type"]``.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from flakekit.errors import ConfigError, FieldError, LayoutError, suggest

__all__ = ["PluginRef", "build_settings", "check_keys", "plugin_ref", "refs"]

T = TypeVar("T")
_SIMPLE = {int: "an integer", str: "a string", float: "a number", bool: "true or false"}


@attrs.frozen
class PluginRef:
    """A reference to a registered plugin thing, as written in config.

    Attributes:
        kind: the registry kind ("clock", "allocator", "segment store", ...).
        type: the registered name.
        settings: the table's other keys (checked against the factory's settings class
            when it is built).
        path: the dotted config path of the reference (for error messages).
        type_path: where the name itself was written (``path`` or ``path.type``).
    """

    kind: str
    type: str
    settings: Mapping[str, Any] = attrs.field(factory=dict)
    path: str = ""
    type_path: str = ""

    @classmethod
    def parse(
        cls, kind: str, value: Any, path: str, default_type: str | None = None
    ) -> PluginRef:
        """``"name"`` or ``{type = "name", ...}`` (``type`` may default)."""
        if isinstance(value, str):
            return cls(kind, value, {}, path, path)
        if isinstance(value, Mapping):
            rest = dict(value)
            name = rest.pop("type", default_type)
            if not isinstance(name, str):
                raise ConfigError(f"{path}.type",
                                  f"is required (e.g. type = \"{_EXAMPLE.get(kind, 'sql')}\")")
            return cls(kind, name, rest, path, f"{path}.type" if "type" in value else path)
        raise ConfigError(path, f"expected a name or a table with a type, got {value!r}")


_EXAMPLE = {"clock": "system", "allocator": "sql", "segment store": "sql", "membership": "sql"}


def plugin_ref(kind: str, default: Any = None, default_type: str | None = None) -> Any:
    """An attrs field holding a :class:`PluginRef` to a ``kind`` plugin; ``default`` is
    the config value used when the key is absent (None: no reference)."""
    return attrs.field(default=None, metadata={
        "plugin_ref": kind, "ref_default": default, "default_type": default_type})


def refs(settings: Any) -> list[PluginRef]:
    """Every plugin reference in a settings object (for tools that look for, say, the
    ``sql`` allocators of a config without building it)."""
    if settings is None or not attrs.has(type(settings)):
        return []
    found = []
    for field in attrs.fields(type(settings)):
        value = getattr(settings, field.name)
        if isinstance(value, PluginRef):
            found.append(value)
    return found


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
    table = dict(table)
    for name, field in fields.items():
        kind = field.metadata.get("plugin_ref")
        if kind is not None:
            raw = table.get(name, field.metadata["ref_default"])
            if raw is not None:
                table[name] = PluginRef.parse(kind, raw, f"{path}.{name}",
                                              field.metadata["default_type"])
            continue
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
        raise ConfigError(f"{path}.{exc.field}", exc.message) from None
    except FieldError as exc:  # a check across fields (__attrs_post_init__) names its field
        raise ConfigError(f"{path}.{exc.field}", _clean(exc.message)) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(path, _clean(str(exc))) from None


def _check_field(field: Any, value: Any, where: str) -> None:
    """Run one field's converter and validator now, so an error names that field."""
    try:
        convert: Any = field.converter
        if isinstance(field.converter, attrs.Converter):  # called as (value, instance, field)
            value = convert(value, None, field)
        elif convert is not None:
            value = convert(value)
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


def _clean(message: str) -> str:
    # attrs validators say "'x' must be <class 'int'> (got ...)": keep it short
    return message.replace("<class '", "").replace("'>", "")
