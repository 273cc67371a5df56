"""The benchmarks: scripts run from the checkout (each prints its figures; docs/benchmarks.md).

They build their images, registries and pinned tools with the tests' own helpers, so importing
this package puts tests/ on the path (``from support.critools import ...``), once for all of them.
"""

import os
import sys

_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
