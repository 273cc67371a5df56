"""podshim's parent-runtime side: the Controller, pods with CRI semantics, and podshimctl.

Importing this package never imports pyroute2: the node agent that embeds it stays light.

- :class:`Controller` (``client.controller``): containerd's sandbox.Controller over podshim shims.
- :class:`NSMap` (``client.nsmap``): namespace -> sandbox id -> handle.
- :class:`Spawner`, :class:`ExecSpawner` (``client.spawners``): how shims are started and deleted.
- The results (``client.results``): frozen dataclasses.

Each is loaded on first use (``from client import Controller`` works as ever): importing a
submodule, as every podshimctl verb does, costs only what that submodule needs.
"""

_LAZY = {
    "Controller": "client.controller",
    "NSMap": "client.nsmap",
    "Spawner": "client.spawners",
    "ExecSpawner": "client.spawners",
    "Bootstrap": "client.results",
    "ControllerInstance": "client.results",
    "ControllerStatus": "client.results",
    "ExitStatus": "client.results",
    "Platform": "client.results",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
