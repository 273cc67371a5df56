"""podshim's parent-runtime side: the Controller, pods with CRI semantics, and podshimctl.

Importing this package never imports pyroute2: the node agent that embeds it stays light.

- :class:`Controller` (``client.controller``): containerd's sandbox.Controller over podshim shims.
- :class:`NSMap` (``client.nsmap``): namespace -> sandbox id -> handle.
- :class:`Spawner`, :class:`ExecSpawner` (``client.spawners``): how shims are started and deleted.
- The results (``client.results``): frozen dataclasses.
"""

from .controller import Controller
from .nsmap import NSMap
from .results import Bootstrap, ControllerInstance, ControllerStatus, ExitStatus, Platform
from .spawners import ExecSpawner, Spawner

__all__ = ["Controller", "NSMap", "Spawner", "ExecSpawner", "Bootstrap", "ControllerInstance", "ControllerStatus",
           "ExitStatus", "Platform"]
