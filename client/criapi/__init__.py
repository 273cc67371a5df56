"""Moved: CRI v1's generated code is :mod:`shim.cri.api` (the CRI layer the shim and its clients
share). This name stays for code outside the repository: ``from client.criapi import api_pb2`` (or
``api_pb2_grpc``, ``NotGenerated``) gives :mod:`shim.cri.api`'s, loaded only when asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["api_pb2", "api_pb2_grpc", "NotGenerated"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    api = importlib.import_module("shim.cri.api")
    return getattr(api, name)
