"""The Controller: containerd's sandbox.Controller (core/runtime/v2, core/sandbox) over podshim shims.

- ``controller``: :class:`Controller` and its verbs (create, start, stop, wait, status, shutdown, ...);
- ``loading``: finding the bundles and reconnecting to their shims after a restart;
- ``liveness``: what a lost connection means (unreachable, watched, revived, or buried);
- ``handle``: one sandbox's shim, its phases and their transitions; ``nsmap``: namespace -> id -> handle;
- ``bundles``: the bundle directories, the only state the Controller keeps;
- ``results``: the frozen dataclasses the verbs return; ``defaults``: every timeout and default path;
- ``spawners/``: how shims are started and deleted (``exec``, ``systemd``).

``Controller`` is loaded on first use: importing a submodule costs only what that submodule needs.
"""

from typing import Any

__all__ = ["Controller", "DEFAULT_BUNDLE_ROOT"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'client.controller' has no attribute {name!r}")
    from client.controller import controller

    return getattr(controller, name)
