"""The fast lane: ``pytest -m "not services and not slow"`` runs the tests that need no
database server, no ZooKeeper or etcd and no child process (README, "Tests").

``services`` is set here, at collection, on a test that
- asks for a fixture reaching a server (PostgreSQL, MariaDB, ZooKeeper, a proxy in front of
  one, a ``flakekit serve`` process), directly or through another fixture;
- carries the ``postgresql``/``mariadb``/``zookeeper`` marker (``db_url``'s parameters do, so
  its SQLite run stays in the fast lane; so do tests that pick a server fixture at run time
  with ``request.getfixturevalue``);
- uses, in its body or in a helper it calls by name, ``subprocess`` or a helper that opens a
  database (:data:`SERVICE_CALLS`): the CLI as a child process, a drill node.

``slow_parallel`` is set here on the ``slow`` drills of :data:`SLOW_PARALLEL`: they hold no
timing margin a busy CPU could eat (wheel builds, processes racing for ids with no deadline
in play), so scripts/test.sh runs them two at a time before the rest run one at a time;
``slow_beside`` on those of :data:`SLOW_BESIDE` (servers of their own, no deadline a slower
CPU could miss): they run at nice 10 beside the one-at-a-time drills.
"""

from __future__ import annotations

import pytest

#: the fixtures of flakekit.testing (pg_url, db_url, manual_clock, ...) for tests/ and the
#: plugins' tests: opt-in, as for any plugin author (no pytest11 entry point, docs/plugins.md)
pytest_plugins = ["flakekit.testing.pytest_plugin"]

#: fixtures (direct or through other fixtures) that talk to a real server or start one
SERVICE_FIXTURES = frozenset({
    "pg_url", "mariadb_url", "tcp_proxy",                      # the flakekit pytest plugin
    "zk_hosts", "zk_ensemble", "zk", "ns",                     # plugins/flakekit-zookeeper
    "etcd_endpoints", "etcd_cluster",                          # plugins/flakekit-etcd
    "redis_url", "rprefix", "throwaway_redis",                 # plugins/flakekit-redis
    "start_server",                                            # plugins/flakekit-server
})
SERVICE_MARKERS = ("postgresql", "mariadb", "zookeeper")
#: names that, used by a test or a helper it calls, mean a server or a child process
SERVICE_CALLS = frozenset({
    "subprocess", "multiprocessing", "fresh_database", "fresh_server_database", "fresh_pg",
})


#: node id prefixes of slow drills that may run beside one another (``slow_parallel``): no
#: lease, pause or timeout whose margin a second busy process could eat
SLOW_PARALLEL = (
    "tests/test_packaging.py",                    # wheel and sdist builds
    "tests/test_deploy.py",                       # the Dockerfile's commands, a healthcheck
    "tests/test_plugins.py",                      # example plugins installed into a venv
    "tests/test_default_registry.py",
    "tests/test_strategies.py",
    "tests/test_segment_fetch_pool.py",           # counts threads
    "tests/test_sql_drills.py::TestManyProcesses",  # processes racing for ids, no deadline
    "tests/test_release_force.py",                # kill -9, release --force: no deadline
    "tests/test_segment_drills.py::TestProcesses",  # processes on one key; kill -9: no deadline
    "plugins/flakekit-server/tests/test_server_load.py",   # 1M IDs: counts, no deadline
    # kill -9 of a client at the 1 h lease: nothing waits for a lease to run out
    "plugins/flakekit-server/tests/test_http_leases.py::test_kill_9_the_client_at_the_defaults",
    "plugins/flakekit-etcd/tests/test_etcd_drills.py::test_many_processes_get_distinct_ids",
    "plugins/flakekit-zookeeper/tests/test_zk_leaf_clock.py",   # refusals at start
)


#: node id prefixes of slow drills that run on database servers of their own and mostly
#: wait (a standby cut for 40 s, a fail-over): no lease or deadline a slower CPU could make
#: them miss (their polls allow 30 s and more). ``slow_beside``: scripts/test.sh runs them
#: at nice 10 beside the one-at-a-time drills, which keep the CPU when they want it
SLOW_BESIDE = (
    "tests/test_failover_drills.py",              # private replicated PostgreSQL/MariaDB
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow_parallel: a slow drill that may run beside "
                            "another (conftest.py SLOW_PARALLEL; scripts/test.sh)")
    config.addinivalue_line("markers", "slow_beside: a slow drill on servers of its own "
                            "that runs at nice 10 beside the others (conftest.py "
                            "SLOW_BESIDE; scripts/test.sh)")


def _reaches(func: object, depth: int = 3) -> bool:
    """Whether ``func`` (a test, or a helper it calls by name) uses :data:`SERVICE_CALLS`;
    a class counts through its methods (``Server(...)`` starts ``flakekit serve``)."""
    if isinstance(func, type):
        return depth > 0 and any(_reaches(f, depth - 1) for f in vars(func).values()
                                 if callable(f))
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    names = set(code.co_names)
    if names & SERVICE_CALLS:
        return True
    if depth == 0:
        return False
    scope = getattr(func, "__globals__", {})
    return any(_reaches(scope[n], depth - 1) for n in names
               if callable(scope.get(n)) and _ours(scope[n]))


def _ours(obj: object) -> bool:
    """Helpers of the tests, not library code (flakekit itself never starts a process)."""
    module = getattr(obj, "__module__", None) or ""
    return not module.startswith(("flakekit.", "builtins", "pytest", "_pytest", "sqlalchemy"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                or any(item.get_closest_marker(m) for m in SERVICE_MARKERS)
                or _reaches(getattr(item, "function", None))):
            item.add_marker(pytest.mark.services)
        if item.get_closest_marker("slow"):
            if item.nodeid.startswith(SLOW_PARALLEL):
                item.add_marker(pytest.mark.slow_parallel)
            elif item.nodeid.startswith(SLOW_BESIDE):
                item.add_marker(pytest.mark.slow_beside)
