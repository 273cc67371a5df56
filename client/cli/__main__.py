"""``python -m client.cli`` is ``podshimctl``."""

from client.cli.main import run

run()
