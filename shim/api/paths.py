"""Names and places: the socket address of a sandbox's shim, the template's, the files a shim keeps.

Part of the contract (:mod:`shim.api`): computed, never looked up (no I/O). A namespace or sandbox
id that is not a containerd identifier is refused, so no id can name a path outside the roots.
"""

from __future__ import annotations

import os

try:  # CPython's own sha256 (as random.py does for sha512): hashlib loads OpenSSL's, 3 ms per process
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]  # CPython's own module, no stub
except ImportError:  # pragma: no cover - other interpreters, CPython >= 3.12
    from hashlib import sha256 as _sha256

from shim.api.identifiers import MAX_IDENTIFIER_CHARS, validate_identifier
from shim.api.names import (
    BOOTSTRAP_FILE,
    BOOTSTRAP_VERSION,
    DEFAULT_RUNTIME_ROOT,
    PROTOCOL,
    STATE_FILE,
    TEMPLATE_SOCKET,
    TEMPLATE_SOCKET_ENV,
)
from shim.rpc.status import InvalidArgument

__all__ = [
    "MAX_IDENTIFIER_CHARS",
    "DEFAULT_RUNTIME_ROOT",
    "SUN_PATH_MAX",
    "validate_identifier",
    "socket_dir",
    "socket_path",
    "socket_address",
    "control_socket_path",
    "template_socket_for",
    "BOOTSTRAP_FILE",
    "STATE_FILE",
    "LOG_FILE",
    "PROTOCOL",
    "BOOTSTRAP_VERSION",
]

#: sizeof(sockaddr_un.sun_path) on Linux, including the terminating NUL.
SUN_PATH_MAX = 108
_HASH_HEX_CHARS = 32  # 128 bits: collisions are not a concern, and long runtime roots still fit

LOG_FILE = "log"


def socket_dir(runtime_root: str = DEFAULT_RUNTIME_ROOT) -> str:
    """The directory holding shim sockets under ``runtime_root`` (mode 0700)."""
    if not os.path.isabs(runtime_root):
        raise InvalidArgument(f"runtime root {runtime_root!r} must be an absolute path")
    return os.path.join(os.path.normpath(runtime_root), "s")


def socket_path(namespace: str, sandbox_id: str, runtime_root: str = DEFAULT_RUNTIME_ROOT) -> str:
    """The socket path for one sandbox: a hash of namespace and id, so it is always short.

    Raises InvalidArgument for a bad identifier or a runtime root too long for sun_path.
    """
    validate_identifier("namespace", namespace)
    validate_identifier("sandbox id", sandbox_id)
    digest = _sha256(f"{namespace}/{sandbox_id}".encode()).hexdigest()[:_HASH_HEX_CHARS]
    path = os.path.join(socket_dir(runtime_root), digest)
    if len(path.encode()) + 1 > SUN_PATH_MAX:
        limit = SUN_PATH_MAX - 1 - _HASH_HEX_CHARS - len("/s/")
        raise InvalidArgument(f"runtime root {runtime_root!r} is too long for a Unix socket path (at most {limit} bytes)")
    return path


def control_socket_path(runtime_root: str = DEFAULT_RUNTIME_ROOT) -> str:
    """Where the shim template of ``runtime_root`` listens (``ROOT/template.sock``)."""
    return os.path.join(os.path.normpath(runtime_root), TEMPLATE_SOCKET)


def template_socket_for(runtime_root: str) -> str:
    """The template a spawner of ``runtime_root`` asks: $PODSHIM_TEMPLATE_SOCKET when set, else
    the runtime root's own."""
    return os.environ.get(TEMPLATE_SOCKET_ENV) or control_socket_path(runtime_root)


def socket_address(path: str) -> str:
    return "unix://" + path
