"""The plugin host: hook specs, name registries and the pluggy manager that fills them.

May import every layer below it (values, leases, generators, sql); never config,
assembly, the CLI or the built-in plugins (it loads those by name).
"""
