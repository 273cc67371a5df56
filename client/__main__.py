"""``python -m client`` is ``podshimctl``."""

import sys

from .cli import main

sys.exit(main())
