"""The wire, shared by the shim and the client: ttrpc's framing with msgpack messages.

Layers, bottom up: ``frames`` (sans-IO codec), ``messages`` (Request/Response maps),
``status`` (codes and typed errors), ``connection`` (stream bookkeeping, sans-IO),
``channel`` (the only code that touches sockets), ``server`` and ``client`` (asyncio), and
``blocking`` (one call, no event loop). Depends on nothing but the standard library, msgpack
and anyio.

``Client``, ``Server`` and friends are loaded on first use, so a process that only needs the
status codes (the ``podshim`` CLI) does not pay for importing asyncio.
"""

from typing import TYPE_CHECKING

from shim.rpc.status import *  # noqa: F401,F403  (the typed errors are part of this package's API)
from shim.rpc.status import __all__ as _status_all

if TYPE_CHECKING:  # what __getattr__ loads on first use, named for the type checker
    from shim.rpc.client import Client as Client
    from shim.rpc.client import connect as connect
    from shim.rpc.server import CallContext as CallContext
    from shim.rpc.server import Server as Server
    from shim.rpc.server import ServerStream as ServerStream

_LAZY = {
    "Client": ".client",
    "connect": ".client",
    "Server": ".server",
    "ServerStream": ".server",
    "CallContext": ".server",
}

__all__ = list(_LAZY) + list(_status_all)


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shim.rpc' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
