"""Fixtures for the ZooKeeper plugin: a real server (scripts/zookeeper.sh), fresh names."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SCRIPT = REPO / "scripts" / "zookeeper.sh"

sys.path.insert(0, str(HERE))


def _read_env(svc: Path) -> dict[str, str]:
    out = {}
    try:
        for line in (svc / "env").read_text().splitlines():
            key, _, value = line.partition("=")
            out[key] = value
    except FileNotFoundError:
        pass
    return out


@pytest.fixture(scope="session")
def zk_hosts(tmp_path_factory: pytest.TempPathFactory):
    """ZK_HOSTS from the environment (scripts/test.sh sets it), else a standalone server
    of this test session's own, started and stopped with scripts/zookeeper.sh."""
    hosts = os.environ.get("ZK_HOSTS")
    if hosts:
        yield hosts
        return
    svc = tmp_path_factory.mktemp("zk-standalone")
    env = {**os.environ, "FLAKEKIT_SVC_DIR": str(svc)}
    subprocess.run(["bash", str(SCRIPT), "start"], check=True, timeout=300, env=env)
    hosts = _read_env(svc).get("ZK_HOSTS", "")
    assert hosts, "scripts/zookeeper.sh start wrote no ZK_HOSTS"
    os.environ["ZK_HOSTS"] = hosts
    try:
        yield hosts
    finally:
        os.environ.pop("ZK_HOSTS", None)
        subprocess.run(["bash", str(SCRIPT), "stop"], check=False, timeout=60, env=env)


@pytest.fixture(scope="session")
def zk_ensemble(zk_hosts: str, tmp_path_factory: pytest.TempPathFactory):
    """A 3-node ensemble on loopback: ``(hosts, service dir)``.

    It gets a service dir of its own, so a `zookeeper.sh stop` from another test run on
    the same machine cannot take it away mid-drill.
    """
    svc = tmp_path_factory.mktemp("zk-svc")
    env = {**os.environ, "FLAKEKIT_SVC_DIR": str(svc)}
    subprocess.run(["bash", str(SCRIPT), "ensemble-start"], check=True, timeout=300, env=env)
    hosts = _read_env(svc).get("ZK_ENSEMBLE_HOSTS", "")
    assert hosts
    yield hosts, svc
    subprocess.run(["bash", str(SCRIPT), "ensemble-stop"], check=False, timeout=60, env=env)


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
