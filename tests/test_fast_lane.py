"""The ``services`` marker conftest.py sets, so that ``pytest -m "not services and not slow"``
(the fast lane) leaves out exactly the tests that need a server or a child process."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _services(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("services") is not None


def test_in_process_test_stays_in_the_fast_lane(request, sqlite_url):
    """SQLite in a temporary directory needs no server."""
    assert sqlite_url.startswith("sqlite:///")
    assert not _services(request)


def test_db_url_marks_only_its_server_runs(request, db_url):
    """``db_url``'s PostgreSQL and MariaDB runs are ``services``; its SQLite run is not."""
    assert _services(request) == (not db_url.startswith("sqlite"))


def test_server_fixture_marks_services(request, tcp_proxy):
    """A fixture that reaches a server (here the fault proxy, started on nothing)."""
    assert callable(tcp_proxy)
    assert _services(request)


def _child() -> int:
    return subprocess.run([sys.executable, "-c", "pass"], check=True).returncode


def test_helper_starting_a_process_marks_services(request):
    """A test whose helper starts a child process (a CLI run, a drill node)."""
    assert _child() == 0
    assert _services(request)
