"""The Controller's results under their first public import path, ``client.results``.

They live in :mod:`client.controller.results`; this name is that module itself (one module
object, so every name and every ``isinstance`` is the same under both paths).
"""

import sys

from client.controller import results

sys.modules[__name__] = results
