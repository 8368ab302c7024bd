"""flakekit's own plugins, registered through the same hooks a third party uses.

The highest core layer with the CLI: may import everything below, plugins import them
only through :mod:`flakekit.plugin`.
"""
