"""SQL adapters (SQLAlchemy Core): engines, schema, worker registry, leaf_alloc store.

May import :mod:`flakekit.values`, :mod:`flakekit.leases` and :mod:`flakekit.errors`;
never the plugin host, config or the CLI.
"""
