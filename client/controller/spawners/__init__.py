"""How the Controller starts a shim, cleans up after a dead one, and lets it go.

- ``base``: the contract every spawner keeps (:class:`Spawner`);
- ``exec``: :class:`ExecSpawner`, shims forked from the runtime root's template (or exec'd);
- ``systemd``: :class:`SystemdSpawner`, one ``podshim@`` unit per shim.
"""

from client.controller.spawners.base import Spawner
from client.controller.spawners.exec import ExecSpawner, default_command, template_wanted

__all__ = ["Spawner", "ExecSpawner", "default_command", "template_wanted"]
