"""Fixtures for the etcd plugin: a real etcd (scripts/etcd.sh), fresh service names."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from flakekit.testing.service_fixtures import fresh_name, own_service
from flakekit.testing.services import read_env, shared_or_own

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SCRIPT = REPO / "scripts" / "etcd.sh"
SVC = Path(os.environ.get("FLAKEKIT_SVC_DIR", "/tmp/flakekit-svc"))

sys.path.insert(0, str(HERE))


def _can_install() -> bool:
    return shutil.which("etcd") is not None or (os.geteuid() == 0 and shutil.which("apt-get"))


@pytest.fixture(scope="session")
def etcd_endpoints(tmp_path_factory: pytest.TempPathFactory):
    """ETCD_ENDPOINTS from the environment (scripts/test.sh exports it) or the env file,
    else a single member of this test session's own (scripts/etcd.sh start/stop)."""
    endpoints = os.environ.get("ETCD_ENDPOINTS") or read_env(SVC).get("ETCD_ENDPOINTS")
    if not endpoints and not _can_install():
        pytest.skip("etcd is not installed and cannot be (needs root and apt-get): "
                    "run `bash scripts/etcd.sh start`")
    with shared_or_own("ETCD_ENDPOINTS", endpoints, SCRIPT,
                       tmp_path_factory.mktemp("etcd-single")) as endpoints:
        yield endpoints


etcd_cluster = own_service(
    "etcd_endpoints", SCRIPT, "cluster-start", "cluster-stop", "ETCD_CLUSTER_ENDPOINTS",
    doc="A 3-member cluster on loopback of this session's own: ``(endpoints, service dir)``.")

ns = fresh_name("etcd_endpoints",
                doc="A fresh service name, so tests never see each other's keys (etcd up).")


@pytest.fixture
def root(etcd_endpoints: str, ns: str):
    """A key root of this test's own (``/{ns}``), its keys deleted afterwards."""
    from etcdhelpers import etcdctl

    path = f"/{ns}"
    yield path
    etcdctl(etcd_endpoints, "del", "--prefix", f"{path}/", check=False)
