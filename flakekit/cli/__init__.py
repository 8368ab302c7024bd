"""The ``flakekit`` command line, one module per command group.

``main`` holds the click group, the shared options and :func:`run`; ``layouts``, ``ids``,
``workers``, ``cluster``, ``plugins`` and ``plugin_new`` each add their commands to it when imported
(below). Plugins add theirs through the ``flakekit_register_commands`` hook. The names
re-exported here are the ones other modules (``flakekit.plugin``, ``flakekit.builtin``)
import from ``flakekit.cli``.
"""

from __future__ import annotations

from flakekit.cli.main import (
    USAGE_ERRORS,
    _add_plugin_commands,  # noqa: F401  (tests add plugin commands)
    cli,
    config_option,
    echo_json,
    json_option,
    main,
    run,
    verbose_option,
)

# each adds its commands to ``cli``; after main so the group exists
from flakekit.cli import cluster, ids, layouts, plugins, workers  # noqa: F401  isort: skip
from flakekit.cli import plugin_new  # noqa: F401  isort: skip
from flakekit.cli.ids import format_option, prefix_option  # isort: skip
from flakekit.cli.layouts import bit_diagram  # isort: skip

__all__ = [
    "USAGE_ERRORS", "bit_diagram", "cli", "config_option", "echo_json", "format_option",
    "json_option", "main", "prefix_option", "run", "verbose_option",
]
