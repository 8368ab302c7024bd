"""Config files: TOML in, checked settings out.

Sections: ``[backends.NAME]``, ``[layouts.NAME]``, ``[generators.NAME]``. Strings may
use ``${ENV}`` (``${ENV:-default}``) so secrets stay out of files. Every error names the
dotted path of the field and suggests the nearest valid name; URLs are printed with their
passwords hidden. With no file at all, :data:`EMBEDDED_DEFAULT` applies: one snowflake
generator leasing its worker id from a SQLite file in the working directory.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from flakekit.backends import DEFAULT_BACKEND_URL, BackendPool, BackendSettings, redact_url
from flakekit.errors import ConfigError, LayoutError, UnknownNameError
from flakekit.layout import BitLayout
from flakekit.settings import check_keys

__all__ = ["EMBEDDED_DEFAULT", "Config", "GeneratorSpec", "load_config", "parse_config"]

SECTIONS = {"backends", "layouts", "generators", "default"}
STRATEGIES = ("snowflake", "segment")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

#: what flakekit uses when no config file is given
EMBEDDED_DEFAULT: dict[str, Any] = {
    "backends": {"default": {"url": DEFAULT_BACKEND_URL}},
    "generators": {
        "default": {
            "strategy": "snowflake",
            "layout": "snowflake",
            "clock": "monotonic",
            "allocator": {"type": "sql", "backend": "default"},
        }
    },
}


@attrs.frozen
class GeneratorSpec:
    """One ``[generators.NAME]`` table, checked at the top level only.

    The strategy's builder checks the rest (it knows its own keys).
    """

    name: str
    strategy: str
    table: dict[str, Any]
    path: str


@attrs.frozen
class Config:
    """A parsed config file.

    Attributes:
        source: the file it came from (None for the embedded default).
        backends: database connections by name.
        layouts: layouts defined in the file.
        generators: generator tables by name, in file order.
        default: the generator ``flakekit next`` uses without a name.
    """

    source: str | None
    backends: dict[str, BackendSettings]
    layouts: dict[str, BitLayout]
    generators: dict[str, GeneratorSpec]
    default: str | None

    def pool(self) -> BackendPool:
        return BackendPool(dict(self.backends))

    def generator(self, name: str | None) -> GeneratorSpec:
        """The named generator, or the default one."""
        if name is None:
            if self.default is None:
                raise ConfigError(
                    "generators", "the config has no generators; add a [generators.NAME] table"
                )
            name = self.default
        if name not in self.generators:
            raise UnknownNameError("generator", "generator", name, self.generators)
        return self.generators[name]


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read and check a config file; ``None`` gives the embedded default."""
    if path is None:
        return parse_config(EMBEDDED_DEFAULT, source=None)
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", f"config file {str(file)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError("", f"cannot read config file {str(file)!r}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"{file}: not valid TOML: {exc}") from None
    return parse_config(data, source=str(file))


def interpolate(value: Any, path: str, env: Mapping[str, str] | None = None) -> Any:
    """Replace ``${NAME}`` / ``${NAME:-default}`` in every string of ``value``."""
    env = os.environ if env is None else env
    if isinstance(value, str):
        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(
                path, f"environment variable {name} is not set (write ${{{name}:-default}} "
                "to give a default)"
            )
        return _ENV.sub(sub, value)
    if isinstance(value, dict):
        return {k: interpolate(v, f"{path}.{k}" if path else k, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, f"{path}[{i}]", env) for i, v in enumerate(value)]
    return value


def _table(data: Any, path: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a table, got {type(data).__name__}")
    return data


def parse_config(data: Mapping[str, Any], source: str | None = None) -> Config:
    """Check a config mapping (as TOML gives it) and build :class:`Config`."""
    check_keys(data, SECTIONS, "")
    data = interpolate(dict(data), "")
    backends = {}
    for name, table in _table(data.get("backends", {}), "backends").items():
        path = f"backends.{name}"
        table = _table(table, path)
        check_keys(table, {"url", "options"}, path)
        url = table.get("url")
        if not isinstance(url, str) or not url:
            raise ConfigError(f"{path}.url", "is required: a SQLAlchemy URL such as "
                              "'postgresql+psycopg://app@127.0.0.1/ids'")
        if "://" not in url:
            raise ConfigError(f"{path}.url", f"{redact_url(url)!r} is not a URL; expected e.g. "
                              "'postgresql+psycopg://app@127.0.0.1/ids' or 'sqlite:///flakekit.db'")
        options = _table(table.get("options", {}), f"{path}.options")
        backends[name] = BackendSettings(url=url, options=options)
    layouts = {}
    for name, table in _table(data.get("layouts", {}), "layouts").items():
        path = f"layouts.{name}"
        try:
            layouts[name] = BitLayout.from_mapping(name, _table(table, path))
        except LayoutError as exc:
            raise ConfigError(f"{path}.{exc.field}", str(exc).split(": ", 1)[-1]) from None
    generators = {}
    for name, table in _table(data.get("generators", {}), "generators").items():
        path = f"generators.{name}"
        table = dict(_table(table, path))
        strategy = table.pop("strategy", "snowflake")
        if strategy not in STRATEGIES:
            raise UnknownNameError(f"{path}.strategy", "strategy", str(strategy), STRATEGIES)
        generators[name] = GeneratorSpec(name, strategy, table, path)
    default = data.get("default")
    if default is not None and default not in generators:
        raise UnknownNameError("default", "generator", str(default), generators)
    if default is None and generators:
        default = "default" if "default" in generators else next(iter(generators))
    return Config(source, backends, layouts, generators, default)
