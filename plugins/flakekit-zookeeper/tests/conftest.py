"""Fixtures for the ZooKeeper plugin: a real server (scripts/zookeeper.sh), fresh names."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from flakekit.testing.services import script_service, shared_or_own

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


@pytest.fixture(scope="session")
def zk_ensemble(zk_hosts: str, tmp_path_factory: pytest.TempPathFactory):
    """A 3-node ensemble on loopback: ``(hosts, service dir)``.

    It gets a service dir of its own, so a `zookeeper.sh stop` from another test run on
    the same machine cannot take it away mid-drill.
    """
    svc = tmp_path_factory.mktemp("zk-svc")
    with script_service(SCRIPT, svc, "ensemble-start", "ensemble-stop",
                        "ZK_ENSEMBLE_HOSTS") as hosts:
        yield hosts, svc


@pytest.fixture
def ns(zk_hosts: str) -> str:
    """A fresh generator name, so tests never see each other's znodes (ZooKeeper up)."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def zk(zk_hosts: str):
    """A raw kazoo client for looking at (and tampering with) znodes."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zk_hosts, timeout=5)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()
