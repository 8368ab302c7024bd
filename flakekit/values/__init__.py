"""Value types and time: layouts, clocks, durations, batches, string forms, event sinks,
stats records.

The lowest layer: no I/O, no pluggy. Modules here import only :mod:`flakekit.errors` and
each other.
"""
