"""containerd's shim API (github.com/containerd/containerd/api) as generated Python code.

None of it is in the repository: .ci/install compiles the .proto files .ci/pins.toml pins, at their
pinned sha256, into this package (``.ci/gotool schemas`` does it alone in a development checkout).
Each module is named by its file's path in containerd's API module: ``runtime/sandbox/v1/sandbox.proto``
is :mod:`shim.containerd.api.runtime.sandbox.v1.sandbox_pb2`. :func:`load` imports one, and says how to
make it when it was never compiled.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class NotGenerated(ImportError):
    """containerd's generated API code is missing: podshim was not installed with .ci/install."""


def load(module: str) -> ModuleType:
    """The generated module ``module`` (``"runtime.sandbox.v1.sandbox_pb2"``) of this package."""
    name = f"{__name__}.{module}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not name.startswith(exc.name):
            raise
        raise NotGenerated(f"containerd's API code that .ci/install generates ({name}) is missing: install podshim "
                           f"with .ci/install (in a development checkout, .ci/gotool schemas makes it)") from None
