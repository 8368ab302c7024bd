"""Fixtures of flakekit's own tests. The shared ones (manual_clock, event_recorder,
tcp_proxy, pg_url, mariadb_url, sqlite_url, db_url) come from the ``flakekit`` pytest
plugin (flakekit/testing/pytest_plugin.py, loaded by ``pytest_plugins`` in the root
conftest.py: it is opt-in): not defined here."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from flakekit.testing.venvs import venv_with

sys.path.insert(0, os.path.dirname(__file__))

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "flakekit-example-plugin"


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path_factory, monkeypatch):
    """Each test's embedded default gets its own registry, not the user's real one
    (tests that check the default location unset FLAKEKIT_STATE_DIR themselves)."""
    monkeypatch.setenv("FLAKEKIT_STATE_DIR", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def no_node_identity(monkeypatch):
    """$FLAKEKIT_NODE and $FLAKEKIT_ADVERTISE unset: a cluster node's identity comes from
    the config (or the host name), never from the shell that runs the tests."""
    from flakekit.assembly.cluster_spec import ADVERTISE_ENV, NODE_ENV

    monkeypatch.delenv(NODE_ENV, raising=False)
    monkeypatch.delenv(ADVERTISE_ENV, raising=False)


@pytest.fixture
def host():
    """A freshly loaded plugin host without entry points (only built-ins)."""
    from flakekit.pluginhost.host import PluginHost

    return PluginHost().load(entrypoints=False)


@pytest.fixture
def sql_store(db_url):
    """A SqlSegmentStore (table leaf_alloc) on each database; its engine disposed after."""
    from sqlalchemy import create_engine

    from flakekit.sql.leaf import SqlSegmentStore

    store = SqlSegmentStore(create_engine(db_url))
    yield store
    store.engine.dispose()


@pytest.fixture(scope="session")
def example_plugin_venv(tmp_path_factory) -> Path:
    """The ``bin`` directory of a throw-away venv (``--system-site-packages``: it sees
    this venv's flakekit) with examples/flakekit-example-plugin pip-installed into it
    (``--no-deps``). Run ``bin / "flakekit"`` in a subprocess; nothing is installed into
    the running interpreter's environment."""
    base = tmp_path_factory.mktemp("example-venv")
    source = base / EXAMPLE.name  # build from a copy: nothing is written next to the sources
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    try:
        return venv_with(source, base / "venv")
    except RuntimeError as exc:
        pytest.fail(str(exc))
