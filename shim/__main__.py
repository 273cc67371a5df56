"""``python -m shim`` is ``podshim``."""

import sys

from .cli import main

sys.exit(main())
