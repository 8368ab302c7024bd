"""``python -m flakekit.cli``: the same as the ``flakekit`` command."""

from flakekit.cli import main

main()
