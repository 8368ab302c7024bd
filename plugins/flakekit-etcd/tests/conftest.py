"""Fixtures for the etcd plugin: a real etcd (scripts/etcd.sh), fresh service names."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from flakekit.testing.services import read_env, script_service, shared_or_own

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


@pytest.fixture(scope="session")
def etcd_cluster(etcd_endpoints: str, tmp_path_factory: pytest.TempPathFactory):
    """A 3-member cluster on loopback of this session's own: ``(endpoints, service dir)``
    (its own service dir, so no other run can stop it mid-drill)."""
    svc = tmp_path_factory.mktemp("etcd-svc")
    with script_service(SCRIPT, svc, "cluster-start", "cluster-stop",
                        "ETCD_CLUSTER_ENDPOINTS") as endpoints:
        yield endpoints, svc


@pytest.fixture
def ns(etcd_endpoints: str) -> str:
    """A fresh service name, so tests never see each other's keys (etcd up)."""
    return f"t{uuid.uuid4().hex[:10]}"
