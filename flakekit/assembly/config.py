"""Config files: TOML in, checked settings out.

Sections: ``[backends.NAME]``, ``[layouts.NAME]``, ``[generators.NAME]``, ``[cluster]``
(:mod:`flakekit.assembly.cluster_spec`). Strings may
use ``${ENV}`` (``${ENV:-default}``) so secrets stay out of files. Every error names the
dotted path of the field and suggests the nearest valid name; URLs are printed with their
passwords hidden. With no file at all, :func:`embedded_default` applies: one snowflake
generator leasing its worker id from a SQLite file in the user's state directory.

Why paths are anchored: two processes that resolve one config to two registries lease the
same worker id twice and issue the same IDs. So a relative SQLite path means "next to the
config file", never "in whatever directory the process started in", and the embedded
registry lives in one per-user directory (``$FLAKEKIT_STATE_DIR``, else platformdirs'
user state directory).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from flakekit.assembly.choice import (  # re-exported: the CLI resolves --config cheaply
    CONFIG_ENV,
    LOCAL_CONFIG,  # noqa: F401
    REGISTRY_FILE,
    STATE_DIR_ENV,
    ConfigChoice,
    find_config,
    state_dir,
)
from flakekit.assembly.cluster_spec import ClusterSpec, parse_cluster
from flakekit.assembly.settings import check_keys
from flakekit.errors import ConfigError, LayoutError, UnknownNameError
from flakekit.sql.backends import (
    TIMEOUT_KEYS,
    BackendPool,
    BackendSettings,
    redact_url,
    timeouts_from_table,
)
from flakekit.values.layout import BitLayout

__all__ = [
    "CONFIG_ENV",
    "STATE_DIR_ENV",
    "Config",
    "ConfigChoice",
    "GeneratorSpec",
    "anchor_sqlite_url",
    "embedded_default",
    "find_config",
    "load_config",
    "parse_config",
    "state_dir",
]

SECTIONS = {"backends", "layouts", "generators", "default", "cluster"}
#: the strategy of a generator table without ``strategy`` (the config format's default;
#: strategies themselves are registered by plugins, see flakekit.builtin.strategies)
DEFAULT_STRATEGY = "snowflake"
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

def _sqlite_url(file: Path) -> str:
    from sqlalchemy.engine import URL

    return URL.create("sqlite", database=str(file)).render_as_string(hide_password=False)


def embedded_default() -> dict[str, Any]:
    """What flakekit uses when no config file is given (creates the state directory)."""
    directory = state_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError(
            STATE_DIR_ENV, f"cannot create the state directory {str(directory)!r} of the "
            f"embedded default: {exc.strerror}; set {STATE_DIR_ENV} to a writable directory"
        ) from None
    return {
        "backends": {"default": {"url": _sqlite_url(directory / REGISTRY_FILE)}},
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

    The strategy is looked up, and the rest parsed against its settings class, when the
    config is built (:func:`flakekit.assembly.kit.typed_generators`): the registry of
    strategies belongs to the plugin host, which parsing does not need.
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
        cluster: the ``[cluster]`` section (None: this config runs no cluster).
    """

    source: str | None
    backends: dict[str, BackendSettings]
    layouts: dict[str, BitLayout]
    generators: dict[str, GeneratorSpec]
    default: str | None
    cluster: ClusterSpec | None = None

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
        return parse_config(embedded_default(), source=None)
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", f"config file {str(file)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError("", f"cannot read config file {str(file)!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 (a Latin-1 file, a UTF-16 BOM...)
        line = file.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(
            "", f"config file {str(file)!r} is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} "
            f"on line {line} (TOML files are UTF-8); save it as UTF-8"
        ) from None
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


def anchor_sqlite_url(url: str, base: Path) -> str:
    """A relative SQLite file in ``url`` made absolute against ``base`` (the config
    file's directory); other URLs, in-memory and ``file:`` URI databases unchanged."""
    if not url.startswith("sqlite"):
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:  # reported with its field when the engine is made
        return url
    database = parsed.database
    if (not database or database == ":memory:" or database.startswith("file:")
            or Path(database).is_absolute()):
        return url
    return parsed.set(database=str(base.absolute() / database)).render_as_string(
        hide_password=False)


def _table(data: Any, path: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a table, got {type(data).__name__}")
    return data


def parse_config(data: Mapping[str, Any], source: str | None = None) -> Config:
    """Check a config mapping (as TOML gives it) and build :class:`Config`.

    ``source`` is the file it came from: relative SQLite paths are taken from its
    directory (with no source, from the working directory).
    """
    check_keys(data, SECTIONS, "")
    data = interpolate(dict(data), "")
    backends = {}
    for name, table in _table(data.get("backends", {}), "backends").items():
        path = f"backends.{name}"
        table = _table(table, path)
        check_keys(table, {"url", "options", "replication", *TIMEOUT_KEYS}, path)
        replication = table.get("replication", "any")
        if replication not in ("any", "synchronous"):
            raise ConfigError(f"{path}.replication", "must be \"any\" (report what a "
                              "commit survives) or \"synchronous\" (refuse to fetch or "
                              f"grant without synchronous replication), got {replication!r}")
        url = table.get("url")
        if not isinstance(url, str) or not url:
            raise ConfigError(f"{path}.url", "is required: a SQLAlchemy URL such as "
                              "'postgresql+psycopg://app@127.0.0.1/ids'")
        if "://" not in url:
            raise ConfigError(f"{path}.url", f"{redact_url(url)!r} is not a URL; expected e.g. "
                              "'postgresql+psycopg://app@127.0.0.1/ids' or 'sqlite:///flakekit.db'")
        options = _table(table.get("options", {}), f"{path}.options")
        if source is not None:
            url = anchor_sqlite_url(url, Path(source).parent)
        backends[name] = BackendSettings(url=url, options=options, replication=replication,
                                         **timeouts_from_table(table, path))
    layouts = {}
    for name, table in _table(data.get("layouts", {}), "layouts").items():
        path = f"layouts.{name}"
        try:
            layouts[name] = BitLayout.from_mapping(name, _table(table, path))
        except LayoutError as exc:
            raise ConfigError(f"{path}.{exc.field}", exc.message) from None
    generators = {}
    for name, table in _table(data.get("generators", {}), "generators").items():
        path = f"generators.{name}"
        table = dict(_table(table, path))
        strategy = table.pop("strategy", DEFAULT_STRATEGY)
        if not isinstance(strategy, str):
            raise ConfigError(f"{path}.strategy", f"expected a strategy name, got {strategy!r}")
        generators[name] = GeneratorSpec(name, strategy, table, path)
    default = data.get("default")
    if default is not None and default not in generators:
        raise UnknownNameError("default", "generator", str(default), generators)
    if default is None and generators:
        default = "default" if "default" in generators else next(iter(generators))
    cluster = parse_cluster(data["cluster"]) if "cluster" in data else None
    return Config(source, backends, layouts, generators, default, cluster)
