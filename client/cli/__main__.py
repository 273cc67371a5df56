"""``python -m client.cli`` is ``podshimctl``."""

import gc

gc.disable()  # off while it starts: see shim.lib.program.long_running

from client.cli.main import run  # noqa: E402  (imported once the collector is off)

run()
