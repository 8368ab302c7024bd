"""Fixtures for the ZooKeeper plugin: a real server (scripts/zookeeper.sh), fresh names."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from flakekit.testing.service_fixtures import fresh_name, own_service
from flakekit.testing.services import shared_or_own

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SCRIPT = REPO / "scripts" / "zookeeper.sh"

sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def zk_hosts(tmp_path_factory: pytest.TempPathFactory):
    """ZK_HOSTS from the environment (scripts/test.sh sets it), else a standalone server
    of this test session's own, started and stopped with scripts/zookeeper.sh."""
    with shared_or_own("ZK_HOSTS", os.environ.get("ZK_HOSTS"), SCRIPT,
                       tmp_path_factory.mktemp("zk-standalone")) as hosts:
        yield hosts


zk_ensemble = own_service(
    "zk_hosts", SCRIPT, "ensemble-start", "ensemble-stop", "ZK_ENSEMBLE_HOSTS",
    doc="A 3-node ensemble on loopback of this session's own: ``(hosts, service dir)``.")

ns = fresh_name("zk_hosts", doc="A fresh generator name, so tests never see each other's "
                "znodes (ZooKeeper up).")


@pytest.fixture
def zk(zk_hosts: str):
    """A raw kazoo client for looking at (and tampering with) znodes."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zk_hosts, timeout=5)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def root(zk, ns: str):
    """A root znode of this test's own (``/{ns}``), removed afterwards."""
    path = f"/{ns}"
    yield path
    try:
        zk.delete(path, recursive=True)
    except Exception:  # noqa: BLE001 - cleanup only
        pass
