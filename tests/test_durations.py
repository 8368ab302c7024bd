"""One duration value (:class:`~flakekit.values.timeunits.Duration`): every settings class
of the core and the bundled plugins keeps its durations through ``attrs.evolve`` and
through its TOML form, and a bare number in config still reads in the field's unit."""

from __future__ import annotations

import importlib
import json
import pkgutil
import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest

from flakekit.assembly.settings import PluginRef, build_settings
from flakekit.errors import ConfigError
from flakekit.values.timeunits import Duration, format_unit, to_duration

ROOT = Path(__file__).resolve().parent.parent
NS = 1_000_000_000
#: the required fields of the settings classes that do not build with defaults alone
REQUIRED: dict[str, dict[str, Any]] = {
    "HttpAllocatorSettings": {"url": "http://ids:8080"},
    "ClusterSettings": {"name": "c", "node": "n1"},
    "BackendSettings": {"url": "sqlite://"},
}


def _packages() -> list[str]:
    """flakekit and every bundled plugin's package (``plugins/*/flakekit_*``)."""
    plugins = sorted(p.name for p in ROOT.glob("plugins/*/flakekit_*")
                     if (p / "__init__.py").is_file())
    return ["flakekit", *plugins]


def _settings_classes() -> list[type]:
    """Every attrs class named ``...Settings`` or ``...Options`` defined in those packages."""
    found: dict[str, type] = {}
    for package in _packages():
        root = importlib.import_module(package)
        names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")
                             if not m.name.endswith("__main__")]
        for name in names:
            module = importlib.import_module(name)
            for obj in vars(module).values():
                if isinstance(obj, type) and attrs.has(obj) and obj.__module__ == name \
                        and obj.__name__.endswith(("Settings", "Options")):
                    found[f"{name}.{obj.__qualname__}"] = obj
    return [found[key] for key in sorted(found)]


CLASSES = _settings_classes()


def _defaults(cls: type) -> Any:
    """The class filled from an empty config table (plus its required fields), as
    ``flakekit`` builds it from a config file."""
    return build_settings(cls, REQUIRED.get(cls.__name__, {}), "x")


def _toml(value: Any) -> str | None:
    """``value`` as a TOML value, None for one that has no TOML form (left out)."""
    if isinstance(value, Duration):
        return json.dumps(format_unit(value))
    if isinstance(value, PluginRef):  # as written: "name" or {type = "name", ...}
        if value.type_path == value.path:
            return json.dumps(value.type)
        return _toml({"type": value.type, **value.settings})
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        items = [_toml(item) for item in value]
        return None if None in items else f"[{', '.join(items)}]"  # type: ignore[arg-type]
    if isinstance(value, dict):
        pairs = {k: _toml(v) for k, v in value.items()}
        if None in pairs.values():
            return None
        return "{" + ", ".join(f"{json.dumps(k)} = {v}" for k, v in pairs.items()) + "}"
    return None


def _round_trip(cls: type, settings: Any) -> tuple[Any, str]:
    """``settings`` written as a config table and built again; a value with no TOML form
    (a token set, ...) is passed as it is, a None left out."""
    lines, as_is = [], {}
    for field in attrs.fields(cls):
        key, value = field.alias or field.name, getattr(settings, field.name)
        text = _toml(value) if field.init else None
        if text is not None:
            lines.append(f"{key} = {text}")
        elif field.init and value is not None:
            as_is[key] = value
    text = "\n".join(lines)
    return build_settings(cls, {**tomllib.loads(text), **as_is}, "x"), text


def test_the_walk_finds_the_settings_classes():
    """A walk that found nothing would pass everything below."""
    names = {cls.__name__ for cls in CLASSES}
    assert len(CLASSES) >= 19, names
    assert {"SqlAllocatorSettings", "SegmentSettings", "SystemSettings", "EtcdSettings",
            "ZooKeeperSettings", "RedisSettings", "ServerOptions"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_evolve_keeps_every_value(cls):
    """``attrs.evolve(s) == s``: a duration the converter read passes through it."""
    try:
        plain = cls(**REQUIRED.get(cls.__name__, {}))
    except TypeError as exc:
        pytest.fail(f"{cls.__name__} does not build with defaults: add it to REQUIRED ({exc})")
    assert attrs.evolve(plain) == plain
    configured = _defaults(cls)
    assert attrs.evolve(configured) == configured
    assert attrs.evolve(attrs.evolve(configured)) == configured


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_toml_round_trip_keeps_every_value(cls):
    """Written as config (durations as ``"10s"``) and read back: the same settings."""
    settings = _defaults(cls)
    again, text = _round_trip(cls, settings)
    assert again == settings, text


def test_durations_are_duration_values():
    """Each duration field holds a Duration (what lets evolve tell it from config)."""
    from flakekit.builtin.sql import SqlAllocatorSettings
    from flakekit.generators.segment_settings import SegmentSettings
    from flakekit.values.clock import SystemSettings

    for settings in (SqlAllocatorSettings(), SegmentSettings(), SystemSettings()):
        durations = [v for v in attrs.asdict(settings, recurse=False).values()
                     if isinstance(v, Duration)]
        assert durations, settings
    assert all(isinstance(t, Duration) for t in SqlAllocatorSettings().reclaim_after)


def test_non_default_durations_survive_evolve_and_toml():
    """Values set in config, bare numbers included, keep their meaning both ways."""
    from flakekit.builtin.sql import SqlAllocatorSettings
    from flakekit.generators.segment_settings import SegmentSettings
    from flakekit.values.clock import SystemSettings

    cases = [
        (SystemSettings, {"max_backward": 7}, "max_backward", 7_000_000),  # ms, as before
        (SystemSettings, {"max_backward": "1.5s"}, "max_backward", 1_500_000_000),
        (SqlAllocatorSettings, {"heartbeat": 2}, "heartbeat", 2 * NS),  # seconds
        (SqlAllocatorSettings, {"reclaim_after": ["2h", 600]}, "reclaim_after",
         (7200 * NS, 600 * NS)),
        (SegmentSettings, {"wait_budget": "250ms"}, "wait_budget", 250_000_000),
        (SegmentSettings, {"segment_ttl": "90s"}, "segment_ttl", 90 * NS),
    ]
    for cls, table, field, ns in cases:
        settings = build_settings(cls, table, "x")
        assert getattr(settings, field) == ns
        assert attrs.evolve(settings) == settings
        assert _round_trip(cls, settings)[0] == settings


def test_to_duration_passes_a_duration_through_but_checks_its_bounds():
    """Idempotent: a Duration is not read again (5 s stays 5 s), yet a field with a
    higher floor still refuses it."""
    five = to_duration("5s")
    assert type(five) is Duration and five == 5 * NS
    assert to_duration(five) is five
    assert to_duration(5) == 5 * NS and to_duration(5, unit="ms") == 5_000_000
    with pytest.raises(ValueError, match=r"^must be at least 10s, got 5s$"):
        to_duration(five, minimum=10 * NS)
    with pytest.raises(ValueError, match=r"^must be a positive duration such as '5s', got '0s'$"):
        to_duration("0s", minimum=1, example="5s")
    with pytest.raises(ValueError, match=r"^must be at most 60s, got '2min'$"):
        to_duration("2min", maximum=60 * NS)
    with pytest.raises(ValueError, match="negative"):
        to_duration(-1)


def test_a_bad_duration_names_its_field():
    """Built directly, a FieldError names the field; through the config path the one
    error text gets the field's dotted path."""
    from flakekit.builtin.http_lease import HttpAllocatorSettings
    from flakekit.errors import FieldError
    from flakekit.values.clock import SystemSettings

    with pytest.raises(FieldError, match="finite") as info:
        SystemSettings(max_backward=float("nan"))
    assert info.value.field == "max_backward"

    with pytest.raises(ConfigError, match=r"^x\.timeout: must be a positive duration such "
                                          r"as '5s', got 0$"):
        build_settings(HttpAllocatorSettings, {"url": "http://ids:8080", "timeout": 0}, "x")
