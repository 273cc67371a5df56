"""The wire, shared by the shim and the client: ttrpc's framing with msgpack messages.

Layers, bottom up: ``frames`` (sans-IO codec), ``messages`` (Request/Response maps),
``status`` (codes and typed errors), ``connection`` (stream bookkeeping, sans-IO),
``channel`` (the only code that touches sockets), ``server`` and ``client``.
Depends on nothing but the standard library, msgpack and anyio.
"""

from .client import Client, connect
from .server import CallContext, Server, ServerStream
from .status import *  # noqa: F401,F403  (the typed errors are part of this package's API)
from .status import __all__ as _status_all

__all__ = ["Client", "connect", "Server", "ServerStream", "CallContext", *_status_all]
