"""Config and assembly: TOML parsing, typed settings, the build context and the Kit.

Turns a config into started generators using the plugin host's registries. May import
every layer below it; never the CLI or a built-in plugin directly.
"""
