"""Fixture factories for a plugin's conftest.py: the fixtures every coordination-service
plugin (ZooKeeper, etcd) defines the same way, made once here::

    zk_ensemble = own_service("zk_hosts", SCRIPT, "ensemble-start", "ensemble-stop",
                              "ZK_ENSEMBLE_HOSTS", doc="A 3-node ensemble ...")
    ns = fresh_name("zk_hosts", doc="A fresh generator name ...")

Needs pytest (import it from a conftest only).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flakekit.testing.services import script_service

__all__ = ["fresh_name", "own_service"]


def own_service(needs: str, script: Path, start: str, stop: str, key: str, *,
                doc: str) -> Any:
    """A session fixture yielding ``(addresses, service dir)`` of a service of the
    session's own: ``bash script start`` in a service dir of its own (so a stop from
    another test run on the machine cannot take it away mid-drill), ``key`` read from
    its env file, ``bash script stop`` afterwards. The fixture ``needs`` comes first (the
    single server: it skips when the service cannot run here)."""

    @pytest.fixture(scope="session")
    def fixture(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
        request.getfixturevalue(needs)
        svc = tmp_path_factory.mktemp(f"{start}-svc")
        with script_service(script, svc, start, stop, key) as addresses:
            yield addresses, svc

    fixture.__doc__ = doc
    return fixture


def fresh_name(needs: str, *, doc: str) -> Any:
    """A fixture returning a name no other test uses (``t`` and ten hex digits), once
    the fixture ``needs`` (the service) is up."""

    @pytest.fixture
    def fixture(request: pytest.FixtureRequest) -> str:
        request.getfixturevalue(needs)
        return f"t{uuid.uuid4().hex[:10]}"

    fixture.__doc__ = doc
    return fixture
