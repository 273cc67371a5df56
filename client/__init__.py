"""podshim's parent-runtime side: the Controller, pods with CRI semantics, and podshimctl.

Importing this package never imports pyroute2: the node agent that embeds it stays light.

- :class:`Controller` (``client.controller``): containerd's sandbox.Controller over podshim shims.
- :class:`NSMap` (``client.controller.nsmap``): namespace -> sandbox id -> handle.
- :class:`Spawner`, :class:`ExecSpawner` (``client.controller.spawners``): how shims are started and deleted.
- The results (``client.controller.results``): frozen dataclasses.

Each is loaded on first use (``from client import Controller`` works as ever): importing a
submodule, as every podshimctl verb does, costs only what that submodule needs.
"""

_LAZY = {
    "Controller": "client.controller.controller",
    "NSMap": "client.controller.nsmap",
    "Spawner": "client.controller.spawners",
    "ExecSpawner": "client.controller.spawners",
    "Bootstrap": "client.controller.results",
    "ControllerInstance": "client.controller.results",
    "ControllerStatus": "client.controller.results",
    "ExitStatus": "client.controller.results",
    "Platform": "client.controller.results",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
