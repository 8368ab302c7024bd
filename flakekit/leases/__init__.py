"""Leases: the lease values allocators hand out and the keeper that renews them.

May import :mod:`flakekit.values` and :mod:`flakekit.errors`; never a generator, a
database adapter, the plugin host or config.
"""
