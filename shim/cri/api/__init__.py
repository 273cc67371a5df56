"""CRI v1 (``runtime.v1``) as generated Python code: ``api_pb2`` (messages), ``api_pb2_grpc`` (services).

Neither module is in the repository: .ci/install compiles k8s.io/cri-api's api.proto, at the version
and sha256 .ci/pins.toml pins, into this package (``.ci/gotool schemas`` does it alone, in a
development checkout). Importing this package imports neither: ``from shim.cri.api import api_pb2``.
Where they were never compiled, that import raises :class:`NotGenerated` with a sentence that says so.
"""

from __future__ import annotations

import importlib
from types import ModuleType

GENERATED = ("api_pb2", "api_pb2_grpc")


class NotGenerated(ImportError):
    """The generated CRI code is missing: podshim was not installed with .ci/install."""


def __getattr__(name: str) -> ModuleType:
    # `from shim.cri.api import api_pb2` asks the package for the attribute when importing the
    # submodule failed: that is where a missing generated module gets its sentence.
    if name not in GENERATED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise NotGenerated(f"the CRI code that .ci/install generates ({__name__}.{name}) is missing: install "
                           f"podshim with .ci/install (in a development checkout, .ci/gotool schemas makes it)") from None
