"""``python -m shim`` is ``podshim``."""

import gc

gc.disable()  # off while it starts: see shim.lib.program.long_running

from shim.cli import run  # noqa: E402  (imported once the collector is off)

run()
