"""cgroups: the sandbox's and its tasks' cgroups, v1 and v2, and who makes them.

- ``hierarchies``  the hierarchies this process sees (v1 controllers, the v2 one) and how a process enters them.
- ``resources``    each resource's file on v1 and on v2 (one table), and the checked writes a request asks for.
- ``readers``      reading cgroup files.
- ``stats``        a cgroup's figures: metrics, details, OOM kills.
- ``sandbox``      :class:`SandboxCgroup`: the cgroupfs driver's directories, made, written, killed, removed.
"""

from shim.kernel.cgroups.hierarchies import V2, Hierarchy, birth_in_v2_allowed, discover_hierarchies, entry_files
from shim.kernel.cgroups.resources import RESOURCE_FILES, UPDATE_KEYS, cpu_weight, huge_page_pool
from shim.kernel.cgroups.sandbox import (
                                         DEFAULT_PARENT,
                                         PAUSE_LEAF,
                                         REMOVE_TIMEOUT,
                                         V2_CONTROLLERS,
                                         SandboxCgroup,
                                         hold_parent,
                                         remove_stale_holds,
)
from shim.kernel.cgroups.stats import DETAIL_KEYS, METRIC_KEYS, no_metrics

__all__ = ["DEFAULT_PARENT", "DETAIL_KEYS", "METRIC_KEYS", "REMOVE_TIMEOUT", "UPDATE_KEYS", "RESOURCE_FILES", "V2",
           "V2_CONTROLLERS", "PAUSE_LEAF", "Hierarchy", "cpu_weight", "SandboxCgroup", "birth_in_v2_allowed",
           "huge_page_pool", "discover_hierarchies", "entry_files", "hold_parent", "no_metrics", "remove_stale_holds"]
