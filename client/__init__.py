"""podshim's parent-runtime side: the Controller, pods with CRI semantics, and podshimctl.

Importing this package never imports pyroute2: the node agent that embeds it stays light.

- :class:`Controller` (``client.controller``): containerd's sandbox.Controller over podshim shims.
- :class:`NSMap` (``client.nsmap``): namespace -> sandbox id -> handle.
- :class:`Spawner`, :class:`ExecSpawner` (``client.spawners``): how shims are started and deleted.
- The results (``client.results``): frozen dataclasses.
"""

from client.controller import Controller
from client.nsmap import NSMap
from client.results import Bootstrap, ControllerInstance, ControllerStatus, ExitStatus, Platform
from client.spawners import ExecSpawner, Spawner

__all__ = ["Controller", "NSMap", "Spawner", "ExecSpawner", "Bootstrap", "ControllerInstance", "ControllerStatus",
           "ExitStatus", "Platform"]
