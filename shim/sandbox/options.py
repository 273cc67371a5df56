"""CreateSandbox's ``options``: a PodSandboxConfig-shaped map, parsed and checked once.

Field names follow CRI's PodSandboxConfig as crictl's JSON spells them (protocol.md,
"Sandbox options"). Namespace modes may be CRI's numbers (POD=0, CONTAINER=1, NODE=2) or names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shim.api.cgroups import CGROUPFS, SYSTEMD, check_parent, slice_of_parent
from shim.api.handlers import NAMESPACE_MODES, NATIVE, RUNTIME_HANDLERS
from shim.api.identifiers import validate_annotations, validate_hostname, validate_labels
from shim.lib.idmaps import UserNamespace
from shim.rpc.messages import optional
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import InvalidArgument

if TYPE_CHECKING:  # loaded only for a linux.pause_process: a shim serves without it (issue #15)
    from shim.runtime.confine import Confinement

__all__ = ["namespace_mode", "PauseImage", "SandboxOptions"]



def namespace_mode(value: Any, what: str, allowed: tuple[str, ...] = ("POD", "NODE")) -> str:
    """Normalise a CRI namespace mode (number or name) to its name; InvalidArgument if not allowed."""
    if value is None:
        return "POD"
    if isinstance(value, bool):
        raise InvalidArgument(f"{what} must be a namespace mode, got a boolean")
    if isinstance(value, int):
        name = NAMESPACE_MODES.get(value)
    elif isinstance(value, str):
        name = value.upper()
    else:
        name = None
    if name not in allowed:
        raise InvalidArgument(f"{what} is {value!r}; allowed: {', '.join(allowed)}")
    return name


def _str_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidArgument(f"{what} must be a map of strings to strings")
    return dict(value)


class PauseImage(Record):
    """``pause_image``: the pause as a sandbox image's config makes it (protocol.md 7.4), run from
    CreateSandbox's ``rootfs``. ``env`` holds ``NAME=VALUE`` strings; ``image`` names the image."""

    __slots__ = ("args", "env", "cwd", "image")
    args: tuple[str, ...]
    env: tuple[str, ...]
    cwd: str
    image: str

    def __init__(self, args: tuple[str, ...], env: tuple[str, ...] = (), cwd: str = "/", image: str = "") -> None:
        _set(self, "args", args)
        _set(self, "env", env)
        _set(self, "cwd", cwd)
        _set(self, "image", image)

    @classmethod
    def from_payload(cls, value: Any) -> PauseImage:
        """Parse ``pause_image``; InvalidArgument naming the bad key."""
        if not isinstance(value, dict):
            raise InvalidArgument("pause_image must be a map (args, env, cwd, image)")
        unknown = sorted(set(value) - {"args", "env", "cwd", "image"})
        if unknown:
            raise InvalidArgument(f"pause_image has the unknown key {unknown[0]!r} (known: args, env, cwd, image)")
        args = value.get("args")
        if not isinstance(args, list) or not args or not all(isinstance(a, str) and "\0" not in a for a in args):
            raise InvalidArgument("pause_image.args must be a non-empty array of strings without NUL "
                                  "(the image's Entrypoint and Cmd)")
        if not args[0]:
            raise InvalidArgument("pause_image.args[0] (the program) must not be empty")
        env = value.get("env") or []
        if not isinstance(env, list) or not all(isinstance(e, str) and e.partition("=")[0] and "=" in e
                                                and "\0" not in e for e in env):
            raise InvalidArgument("pause_image.env must be an array of NAME=VALUE strings")
        cwd = value.get("cwd") or "/"
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
            raise InvalidArgument(f"pause_image.cwd must be an absolute path, not {cwd!r}")
        image = value.get("image") or ""
        if not isinstance(image, str):
            raise InvalidArgument("pause_image.image must be a string (the image's name)")
        return cls(tuple(args), tuple(env), cwd, image)


class SandboxOptions(Record):
    """What the shim needs from a PodSandboxConfig."""

    __slots__ = ("hostname", "labels", "annotations", "cgroup_parent", "sysctls", "network_mode", "pid_mode",
                 "ipc_mode", "oom_score_adj", "pause_binary", "runtime_handler", "pause_confinement", "pause_image",
                 "privileged", "userns", "cgroup_driver", "resources")
    hostname: str | None
    labels: dict[str, str]
    annotations: dict[str, str]
    cgroup_parent: str | None
    sysctls: dict[str, str]
    network_mode: str
    pid_mode: str
    ipc_mode: str
    oom_score_adj: int
    pause_binary: str | None
    runtime_handler: str
    pause_confinement: Confinement | None  # linux.pause_process: the pause's user, capabilities, ...
    pause_image: PauseImage | None  # the pause from CreateSandbox's rootfs (a sandbox image)
    privileged: bool  # linux.security_context.privileged: the pod's device cgroup allows every device
    userns: UserNamespace | None  # namespace_options.userns_options (mode POD): the pod's user namespace
    cgroup_driver: str  # linux.cgroup_driver: who makes the pod's cgroup, "cgroupfs" (the shim) or "systemd"
    #: linux.resources: the pod's own resources (UpdateSandbox's keys), its cgroup's from its start
    #: (under the systemd driver its scope's properties from StartTransientUnit on)
    resources: dict[str, Any]

    def __init__(self, hostname: str | None = None, labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None, cgroup_parent: str | None = None,
                 sysctls: dict[str, str] | None = None, network_mode: str = "POD", pid_mode: str = "POD",
                 ipc_mode: str = "POD", oom_score_adj: int = -998, pause_binary: str | None = None,
                 runtime_handler: str = NATIVE, pause_confinement: Confinement | None = None,
                 pause_image: PauseImage | None = None, privileged: bool = False,
                 userns: UserNamespace | None = None, cgroup_driver: str = "cgroupfs",
                 resources: dict[str, Any] | None = None) -> None:
        _set(self, "hostname", hostname)
        _set(self, "labels", {} if labels is None else labels)
        _set(self, "annotations", {} if annotations is None else annotations)
        _set(self, "cgroup_parent", cgroup_parent)
        _set(self, "sysctls", {} if sysctls is None else sysctls)
        _set(self, "network_mode", network_mode)
        _set(self, "pid_mode", pid_mode)
        _set(self, "ipc_mode", ipc_mode)
        _set(self, "oom_score_adj", oom_score_adj)
        _set(self, "pause_binary", pause_binary)
        _set(self, "runtime_handler", runtime_handler)
        _set(self, "pause_confinement", pause_confinement)
        _set(self, "pause_image", pause_image)
        _set(self, "privileged", privileged)
        _set(self, "userns", userns)
        _set(self, "cgroup_driver", cgroup_driver)
        _set(self, "resources", {} if resources is None else resources)

    @property
    def host_network(self) -> bool:
        return self.network_mode == "NODE"

    @classmethod
    def from_payload(cls, options: Any, annotations: dict[str, str] | None = None) -> SandboxOptions:
        """Parse the ``options`` map of CreateSandbox, with the request's own ``annotations``
        merged over the map's; raises InvalidArgument naming the bad field.

        The hostname, labels and annotations must be within what CRI and Kubernetes allow (see
        :mod:`shim.api.identifiers`); an empty hostname is CRI's "unset".
        """
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise InvalidArgument("field 'options' must be a map (a PodSandboxConfig)")
        hostname = optional(options, "hostname", str) or None
        if hostname is not None:
            validate_hostname(hostname)
        labels = _str_map(options.get("labels"), "labels")
        validate_labels(labels)
        merged = {**_str_map(options.get("annotations"), "annotations"), **(annotations or {})}
        validate_annotations(merged)
        linux = optional(options, "linux", dict, {})
        cgroup_parent = optional(linux, "cgroup_parent", str) or None
        if cgroup_parent is not None and (".." in cgroup_parent.split("/") or "\x00" in cgroup_parent):
            raise InvalidArgument(f"linux.cgroup_parent {cgroup_parent!r} must not contain '..'")
        cgroup_driver = optional(linux, "cgroup_driver", str) or CGROUPFS
        try:
            check_parent(cgroup_parent, cgroup_driver)
            if cgroup_driver == SYSTEMD and cgroup_parent is not None:
                cgroup_parent = slice_of_parent(cgroup_parent)  # kubelet sends the slice's path
        except InvalidArgument as exc:
            raise InvalidArgument(f"linux.cgroup_parent: {exc.message}") from None
        resources = _pod_resources(optional(linux, "resources", dict, {}))
        security = optional(linux, "security_context", dict, {})
        ns_opts = optional(security, "namespace_options", dict, {})
        privileged = optional(security, "privileged", bool, False)
        oom = optional(linux, "oom_score_adj", int, -998)
        if not -1000 <= oom <= 1000:
            raise InvalidArgument(f"linux.oom_score_adj {oom} is outside -1000..1000")
        pause_binary = optional(options, "pause_binary", str)
        if pause_binary is not None and pause_binary != "builtin" and not pause_binary.startswith("/"):
            raise InvalidArgument("pause_binary must be an absolute path or 'builtin'")
        pause_process = optional(linux, "pause_process", dict)
        pause_confinement = None
        if pause_process is not None:
            from shim.runtime import confine

            try:
                pause_confinement = confine.from_request(pause_process)
            except InvalidArgument as exc:
                raise InvalidArgument(f"linux.pause_process: {exc.message}") from None
        handler = optional(options, "runtime_handler", str) or NATIVE
        if handler not in RUNTIME_HANDLERS:
            raise InvalidArgument(f"runtime_handler {handler!r} is not known (known: {', '.join(RUNTIME_HANDLERS)})")
        if pause_binary is not None and handler != NATIVE:
            raise InvalidArgument(f"pause_binary is for the native runtime handler; {handler} runs catatonit "
                                  "from the shared pause rootfs")
        pause_image = optional(options, "pause_image", dict)
        image = None if pause_image is None else PauseImage.from_payload(pause_image)
        if image is not None and pause_binary is not None:
            raise InvalidArgument("pause_binary and pause_image are both set: the pause is one or the other")
        return cls(
            hostname=hostname,
            labels=labels,
            annotations=merged,
            cgroup_parent=cgroup_parent,
            sysctls=_str_map(linux.get("sysctls"), "linux.sysctls"),
            network_mode=namespace_mode(ns_opts.get("network"), "namespace_options.network"),
            pid_mode=namespace_mode(ns_opts.get("pid"), "namespace_options.pid", ("POD", "CONTAINER", "NODE"))
            .replace("CONTAINER", "POD"),
            ipc_mode=namespace_mode(ns_opts.get("ipc"), "namespace_options.ipc"),
            oom_score_adj=oom,
            pause_binary=pause_binary,
            runtime_handler=handler,
            pause_confinement=pause_confinement,
            pause_image=image,
            privileged=privileged,
            userns=_userns(ns_opts.get("userns_options")),
            cgroup_driver=cgroup_driver,
            resources=resources,
        )


def _pod_resources(resources: dict[str, Any]) -> dict[str, Any]:
    """``linux.resources``: UpdateSandbox's keys, each set (a None is dropped: "as it is"); their
    values are checked where they are written (the sandbox's cgroup, at Start)."""
    from shim.kernel.cgroups import UPDATE_KEYS

    for key in resources:
        if key == "oom_score_adj":
            raise InvalidArgument("linux.resources.oom_score_adj: it is a process's, not a cgroup's: "
                                  "linux.oom_score_adj sets the pause's")
        if key not in UPDATE_KEYS:
            raise InvalidArgument(f"linux.resources.{key} is not a resource (known: "
                                  f"{', '.join(k for k in UPDATE_KEYS if k != 'oom_score_adj')})")
    return {key: value for key, value in resources.items() if value is not None}


def _userns(options: Any) -> UserNamespace | None:
    """``namespace_options.userns_options``: mode POD with its mappings, or NODE (None: the host's)."""
    if options is None:
        return None
    if not isinstance(options, dict):
        raise InvalidArgument("namespace_options.userns_options must be a map")
    mode = options.get("mode", "POD")
    if mode in ("NODE", 2):
        return None
    if mode not in ("POD", 0):
        raise InvalidArgument(f"namespace_options.userns_options.mode {mode!r} is not supported (POD or NODE)")
    return UserNamespace.from_payload(options, "namespace_options.userns_options")
