"""``python -m shim`` is ``podshim``."""

import sys

from shim.cli import main

sys.exit(main())
