"""The generators: snowflake and segment hot paths (plain Python, no I/O, no pluggy).

Background threads (renewals, prefetches) do the I/O through the objects handed in.
May import :mod:`flakekit.values` and :mod:`flakekit.leases`.
"""
