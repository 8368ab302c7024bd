"""Fixtures of the server tests (helpers live in server_testing.py)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from cluster_testing import cluster_db, start_cluster, trio  # noqa: F401 - fixtures
from server_testing import invoice_node, start_server  # noqa: F401 - fixtures
