"""The Controller's defaults in one place: where it keeps things and how long it waits.

Every timeout of the Controller and its spawners is named here, in seconds; the code that waits
imports the name, so a figure is changed in one place and a reader finds what bounds each step.
Figures containerd also has are noted with its value.
"""

from __future__ import annotations

import os

from shim.api.names import DEFAULT_BUNDLE_ROOT, DEFAULT_RUNTIME_ROOT

__all__ = [
    "DEFAULT_BUNDLE_ROOT",
    "DEFAULT_RUNTIME_ROOT",
    "PODSHIMD_SOCKET",
    "podshimd_endpoint",
    "LOAD_TIMEOUT",
    "CONNECT_TIMEOUT",
    "CREATE_TIMEOUT",
    "START_TIMEOUT",
    "CALL_TIMEOUT",
    "SHUTDOWN_TIMEOUT",
    "DISCARD_TIMEOUT",
    "EXIT_GRACE",
    "DEFAULT_STOP_GRACE",
    "STOP_MARGIN",
    "SPAWN_TIMEOUT",
    "TEMPLATE_SPAWNS_AT_ONCE",
    "SPAWN_THREADS",
    "TEMPLATE_CONNECT_TIMEOUT",
    "TEMPLATE_START_TIMEOUT",
    "DELETE_TIMEOUT",
    "UNIT_STOP_TIMEOUT",
]

# DEFAULT_BUNDLE_ROOT: where bundles live, ``<bundle root>/<namespace>/<sandbox id>/``; not
# podshimd's state root, whose layout is another (docs/roots.md, client.layouts).

#: podshimd's CRI socket in its runtime root, unless ``listen`` says otherwise; podshimctl's pod
#: verbs look for it there by default.
PODSHIMD_SOCKET = "podshimd.sock"


def podshimd_endpoint(runtime_root: str) -> str:
    """``unix://RUNTIME_ROOT/podshimd.sock``: podshimd's default socket for that runtime root."""
    return f"unix://{os.path.join(os.path.abspath(runtime_root), PODSHIMD_SOCKET)}"


# -- the Controller -----------------------------------------------------------------------------
#: Reconnecting to one shim after a restart: connect + SandboxStatus (containerd: 5 s).
LOAD_TIMEOUT = 5.0
#: Connecting to a shim: one that just printed its address (the socket accepts already), or
#: one that did not answer before and is tried again.
CONNECT_TIMEOUT = 5.0
#: CreateSandbox (options are checked, a netns is made).
CREATE_TIMEOUT = 10.0
#: StartSandbox (the pause is launched).
START_TIMEOUT = 10.0
#: Status, Platform, Metrics: calls that only read.
CALL_TIMEOUT = 5.0
#: ShutdownSandbox, then again for the shim to close the connection (containerd: 3 s).
SHUTDOWN_TIMEOUT = 5.0
#: Best-effort ShutdownSandbox when undoing a create that failed; `podshim delete` follows anyway.
DISCARD_TIMEOUT = 3.0
#: How long a shim that is exiting (the kernel marks it so before it closes its sockets) may take
#: to become a zombie once its connection dropped; past that it counts as alive (unreachable),
#: and is cleaned up when it does exit.
EXIT_GRACE = 1.0
#: StopSandbox's grace period when none is given: the shim's default (protocol.md 7.1).
DEFAULT_STOP_GRACE = 10.0
#: StopSandbox's deadline beyond its grace period: the shim's SIGKILL wait (10 s) and slack.
STOP_MARGIN = 15.0

# -- the spawners -------------------------------------------------------------------------------
#: How long ``podshim start`` (or the template's Spawn) may take, from when it runs (containerd
#: bounds start by its ctx). Above the shim's own start timeout (shim.launch.spawn, 8 s), so
#: `podshim start` always ends its own child and reports before it is killed.
SPAWN_TIMEOUT = 10.0
#: Spawns one spawner asks of a shim template at once; more wait their turn in the spawner, so
#: that SPAWN_TIMEOUT bounds the template's work on a Spawn, not its queue (a hundred pods started
#: together on a busy node waited past it there and failed).
TEMPLATE_SPAWNS_AT_ONCE = 4
#: Threads one spawner asks a template from (Spawns in it, and Spawns waiting for their turn):
#: a thread lets its Spawn's turn go as soon as the template answered, whatever this process's
#: event loop is busy with.
SPAWN_THREADS = 16
#: Connecting to a shim template's control socket; a template that does not accept by then is
#: passed over and ``podshim start`` runs instead.
TEMPLATE_CONNECT_TIMEOUT = 1.0
#: Starting the runtime root's shim template when none answers (``podshim template --detach``):
#: its wait for another caller that is starting one, then its own template's start (which it
#: waits for up to shim.launch.spawn's START_TIMEOUT, 8 s).
TEMPLATE_START_TIMEOUT = 10.0
#: How long ``podshim delete`` may take: it may wait up to 5 s for each of the shim and the
#: pause to die after SIGKILL (containerd's shim cleanup timeout is 5 s for one process), and,
#: under the systemd cgroup driver, for systemd's jobs stopping the sandbox's scopes and slice, and
#: for runc's or crun's ``delete --force`` of each container (each their own bound): it is killed
#: at this deadline, and what it had not removed yet is cleaned again at the next shutdown.
DELETE_TIMEOUT = 30.0
#: One ``systemctl stop`` (or kill, reset-failed) of a shim's units: the unit's TimeoutStopSec=
#: (20 s) for the shim's own shutdown, then its ExecStopPost= ``podshim delete``, and slack.
UNIT_STOP_TIMEOUT = 45.0
