"""Which config file a command uses (``--config``, ``$FLAKEKIT_CONFIG``,
``./flakekit.toml``, else the embedded default) and where the embedded registry lives.

Its own module, re-exported by :mod:`flakekit.assembly.config`: every command with
``--config`` resolves it, ``flakekit decode`` too, and that must not import the TOML
parser, SQLAlchemy's settings or the cluster section's parser.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from flakekit.errors import ConfigError

if TYPE_CHECKING:  # pathlib when a state directory is asked for: not for decode
    from pathlib import Path

__all__ = ["CONFIG_ENV", "LOCAL_CONFIG", "REGISTRY_FILE", "STATE_DIR_ENV", "ConfigChoice",
           "find_config", "state_dir"]

#: the config file to use when no --config is given (else ./flakekit.toml, else the default)
CONFIG_ENV = "FLAKEKIT_CONFIG"
#: where the embedded default keeps its registry (else platformdirs' user state directory)
STATE_DIR_ENV = "FLAKEKIT_STATE_DIR"
LOCAL_CONFIG = "flakekit.toml"
REGISTRY_FILE = "flakekit.db"


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """The per-user directory of the embedded registry: the same for every process of
    the user on this host, whatever its working directory."""
    from pathlib import Path

    env = os.environ if env is None else env
    raw = env.get(STATE_DIR_ENV)
    if raw:
        path = Path(raw).expanduser()
        if not path.is_absolute():  # relative: one registry per working directory again
            raise ConfigError(STATE_DIR_ENV, f"{raw!r} is not an absolute path; processes "
                              "started in other directories would use other registries")
        return path
    import platformdirs

    return Path(platformdirs.user_state_dir("flakekit", appauthor=False))


@attrs.frozen
class ConfigChoice:
    """Which config a command uses and why (``flakekit -v ...``, ``config check``)."""

    path: str | None
    reason: str

    def describe(self) -> str:
        if self.path is None:
            registry = state_dir() / REGISTRY_FILE
            return f"the embedded default (registry {registry}; {self.reason})"
        return f"{self.path} ({self.reason})"


def find_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> ConfigChoice:
    """``path``, else ``$FLAKEKIT_CONFIG``, else ``./flakekit.toml`` if present, else the
    embedded default (``path`` None)."""
    if path is not None:
        return ConfigChoice(str(path), "--config")
    env = os.environ if env is None else env
    if env.get(CONFIG_ENV):
        return ConfigChoice(env[CONFIG_ENV], f"${CONFIG_ENV}")
    if os.path.isfile(LOCAL_CONFIG):
        return ConfigChoice(LOCAL_CONFIG, "found in the working directory")
    return ConfigChoice(None, f"no --config, ${CONFIG_ENV} or ./{LOCAL_CONFIG}")
