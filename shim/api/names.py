"""Service and method names of the shim's API (protocol.md, "Services"), shared with clients."""

from __future__ import annotations

__all__ = ["SANDBOX_SERVICE", "EVENTS_SERVICE", "TASK_SERVICE", "TEMPLATE_SERVICE", "TEMPLATE_METHODS",
           "SANDBOX_METHODS", "EVENTS_METHODS", "TASK_METHODS", "BOOTSTRAP_FILE", "BOOTSTRAP_VERSION", "PROTOCOL",
           "STATE_FILE", "DEFAULT_RUNTIME_ROOT", "DEFAULT_BUNDLE_ROOT", "UNKNOWN_EXIT_STATUS", "TEMPLATE_SOCKET", "TEMPLATE_SOCKET_ENV",
           "TEMPLATE_LOCK", "TEMPLATE_START_LOCK", "TEMPLATE_LOG", "TEMPLATE_ENV", "DELETE_LOCK_FILE",
           "DEFAULT_SANDBOXER_SOCKET", "DEFAULT_SANDBOXER_STATE_ROOT", "DEFAULT_CONTAINERD_TTRPC_ADDRESS"]

#: The file in a bundle that holds the bootstrap result (protocol.md, "Bootstrap").
BOOTSTRAP_FILE = "bootstrap.json"
#: The file in a bundle where the shim records what ``podshim delete`` needs, its own pid and
#: start time (``shim_pid``, ``shim_start_time``) among them; a controller reads only those two.
STATE_FILE = "state.json"
#: bootstrap.json "version": 3 is containerd's number for a shim that serves the Sandbox API.
BOOTSTRAP_VERSION = 3
#: bootstrap.json "protocol".
PROTOCOL = "ttrpc+msgpack"
#: Where shims keep their sockets (``<root>/s``) and a template its control socket.
DEFAULT_RUNTIME_ROOT = "/run/podshim"
#: Where a Controller keeps bundles (``<root>/<namespace>/<sandbox id>/``) unless told otherwise:
#: podshimd's own bundle root under its default state root, /var/lib/podshim (docs/roots.md).
DEFAULT_BUNDLE_ROOT = "/var/lib/podshim/sandboxes"
#: podshim-sandboxer (containerd's proxy-plugin route, docs/containerd.md): the socket it serves
#: containerd's sandbox Controller on, and where it keeps its pods' bundles.
DEFAULT_SANDBOXER_SOCKET = "/run/podshim/sandboxer.sock"
DEFAULT_SANDBOXER_STATE_ROOT = "/var/lib/podshim/sandboxer"
#: containerd's own default ttrpc socket, which the shims publish their events to.
DEFAULT_CONTAINERD_TTRPC_ADDRESS = "/run/containerd/containerd.sock.ttrpc"
#: The control socket of a shim template, in the runtime root.
TEMPLATE_SOCKET = "template.sock"
#: An environment variable naming another template control socket (one template may serve
#: several runtime roots: the runtime root travels in each Spawn request).
TEMPLATE_SOCKET_ENV = "PODSHIM_TEMPLATE_SOCKET"
#: In the runtime root: held (flock) by the live template for its whole life: one per root.
TEMPLATE_LOCK = "template.lock"
#: In the runtime root: held while one process checks for a template and starts one.
TEMPLATE_START_LOCK = "template.start.lock"
#: In the runtime root: the stdout and stderr of a template started detached.
TEMPLATE_LOG = "template.log"
#: An environment variable: "0" (or no, false, off) makes Controllers and podshimctl exec every
#: shim instead of starting and using the runtime root's template; "1" (yes, true, on) is the default.
TEMPLATE_ENV = "PODSHIM_TEMPLATE"
#: The exit status of a sandbox whose end nobody saw (containerd's unknownExitCode).
UNKNOWN_EXIT_STATUS = 255

SANDBOX_SERVICE = "podshim.sandbox.v1.Sandbox"
EVENTS_SERVICE = "podshim.events.v1.Events"
TASK_SERVICE = "podshim.task.v1.Task"
TEMPLATE_SERVICE = "podshim.template.v1.Template"

SANDBOX_METHODS = (
    "CreateSandbox", "StartSandbox", "Platform", "StopSandbox", "WaitSandbox",
    "SandboxStatus", "PingSandbox", "ShutdownSandbox", "SandboxMetrics", "UpdateSandbox",
)
EVENTS_METHODS = ("Subscribe",)
TASK_METHODS = ("Create", "Start", "Kill", "Wait", "Delete", "State", "List", "Exec", "ExecStart", "ExecWait", "ExecKill",
                "CloseStdin", "AttachOutput", "Stats", "Update", "ReopenLog")
TEMPLATE_METHODS = ("Spawn", "Ping")

#: In the bundle: flock'd (exclusive) for the whole of a ``podshim delete`` (and of containerd's
#: fast ``delete``), so deletes of a sandbox take turns. Left in the bundle (whoever removes the
#: bundle removes it); not the bundle directory's own flock, which the Controller holds while its
#: ``podshim delete`` child runs.
DELETE_LOCK_FILE = "delete.lock"
