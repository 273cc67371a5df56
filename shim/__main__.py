"""``python -m shim`` is ``podshim``."""

from shim.cli import run

run()
