"""crictl's JSON configs (``pod-config.json``, ``container-config.json``) as frozen dataclasses.

Field names are CRI's as crictl spells them in JSON (snake_case: ``log_directory``,
``port_mappings``, ``namespace_options``). A JSON ``null`` counts as absent, as Go's decoder
treats it; unknown keys are ignored, because real crictl files carry many fields this runtime
does not use. Every error is :class:`~shim.rpc.status.InvalidArgument` naming the JSON path of
the bad field, e.g. ``metadata.name must be a string, got int``.

Parsing is pure (no I/O) except :meth:`PodSandboxConfig.load` / :meth:`ContainerConfig.load`.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shim.api.identifiers import validate_annotations, validate_hostname, validate_labels
from shim.cri.cdinames import parse_name as parse_cdi_name
from shim.cri.fields import CONTAINER_CONFIG, POD_SANDBOX_CONFIG
from shim.cri.fields import check as check_fields
from shim.cri.resources import pod_resources, shim_resources
from shim.cri.security import ContainerSecurity
from shim.cri.signals import from_cri as cri_signal
from shim.cri.signals import to_cri as cri_signal_name
from shim.lib.files import read_json
from shim.lib.idmaps import UserNamespace
from shim.rpc.status import InvalidArgument

__all__ = [
    "NAMESPACE_MODES",
    "set_fields",
    "PROTOCOLS",
    "SANDBOX_OOM_SCORE_ADJ",
    "MAX_ATTEMPT",
    "PodSandboxMetadata",
    "DnsConfig",
    "PortMapping",
    "NamespaceOptions",
    "PodSandboxConfig",
    "ContainerMetadata",
    "ContainerConfig",
    "Mount",
    "Device",
    "PROPAGATIONS",
    "load_json_object",
]

#: CRI's NamespaceMode enum: the number crictl may write, and its name.
NAMESPACE_MODES = {0: "POD", 1: "CONTAINER", 2: "NODE", 3: "TARGET"}
#: CRI's Protocol enum for port mappings.
PROTOCOLS = {0: "TCP", 1: "UDP", 2: "SCTP"}
#: CRI's MountPropagation enum.
PROPAGATIONS = {0: "PROPAGATION_PRIVATE", 1: "PROPAGATION_HOST_TO_CONTAINER", 2: "PROPAGATION_BIDIRECTIONAL"}
#: The pause's OOM score adjustment: containerd's defaultSandboxOOMAdj ("kubernetes#47938"), so the
#: OOM killer takes a container before the process that holds the pod's namespaces.
SANDBOX_OOM_SCORE_ADJ = -998
#: ``attempt`` is a uint32 in CRI.
MAX_ATTEMPT = 2**32 - 1
_MAX_PORT = 65535

_T = TypeVar("_T")
_TYPE_NAMES = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object", list: "an array"}


_JSON_TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str", dict: "object", list: "array",
                   type(None): "null"}


def _type_name(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


class _Fields:
    """One JSON object being read; every error names the field by its JSON path."""

    def __init__(self, doc: Any, path: str = ""):
        if not isinstance(doc, dict):
            raise InvalidArgument(f"{path or 'the document'} must be {_TYPE_NAMES[dict]}, got {_type_name(doc)}")
        self.doc = doc
        self.path = path

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str, kind: type, required: bool) -> Any:
        value = self.doc.get(key)
        if value is None:
            if required:
                raise InvalidArgument(f"{self.name(key)} is required")
            return None
        # bool is an int in Python but not in JSON: `"attempt": true` is an error.
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise InvalidArgument(f"{self.name(key)} must be {_TYPE_NAMES[kind]}, got {_type_name(value)}")
        return value

    def string(self, key: str, *, required: bool = False) -> str:
        value = self._get(key, str, required)
        if required and value == "":
            raise InvalidArgument(f"{self.name(key)} must not be empty")
        return value or ""

    def integer(self, key: str, *, minimum: int, maximum: int, default: int = 0) -> int:
        value: int | None = self._get(key, int, False)
        if value is None:
            return default
        if not minimum <= value <= maximum:
            raise InvalidArgument(f"{self.name(key)} is {value}; allowed: {minimum}..{maximum}")
        return value

    def boolean(self, key: str) -> bool:
        return bool(self._get(key, bool, False))

    def obj(self, key: str, *, required: bool = False) -> _Fields:
        value = self._get(key, dict, required)
        return _Fields(value if value is not None else {}, self.name(key))

    def str_map(self, key: str) -> dict[str, str]:
        value = self._get(key, dict, False) or {}
        for k, v in value.items():
            if not isinstance(v, str):
                raise InvalidArgument(f"{self.name(key)}.{k} must be a string, got {_type_name(v)}")
        return dict(value)

    def labels(self, key: str = "labels") -> dict[str, str]:
        """A map of CRI labels (qualified-name keys, label values of at most 253 characters)."""
        value = self.str_map(key)
        validate_labels(value, self.name(key))
        return value

    def annotations(self, key: str = "annotations") -> dict[str, str]:
        """A map of Kubernetes annotations (qualified-name keys, at most 256 KiB in all)."""
        value = self.str_map(key)
        validate_annotations(value, self.name(key))
        return value

    def items(self, key: str, read: Callable[[Any, str], _T]) -> tuple[_T, ...]:
        value = self._get(key, list, False) or []
        return tuple(read(item, f"{self.name(key)}[{i}]") for i, item in enumerate(value))

    def str_list(self, key: str) -> tuple[str, ...]:
        return self.items(key, _string_item)

    def mode(self, key: str, allowed: tuple[str, ...], default: str, table: dict[int, str] = NAMESPACE_MODES) -> str:
        """A CRI enum given as its number or its name (any case); returned as the name."""
        value = self.doc.get(key)
        if value is None:
            return default
        if isinstance(value, int) and not isinstance(value, bool):
            name = table.get(value)
        elif isinstance(value, str):
            name = value.upper()
        else:
            name = None
        if name not in allowed:
            numbers = {n: v for v, n in table.items()}
            choices = ", ".join(f"{n} ({numbers[n]})" for n in allowed)
            raise InvalidArgument(f"{self.name(key)} is {value!r}; allowed: {choices}")
        return name


def _string_item(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{path} must be a string, got {_type_name(value)}")
    return value


def _drop_empty(doc: dict[str, Any]) -> dict[str, Any]:
    """Leave out unset fields, as crictl's files do (Go's ``omitempty``)."""
    return {k: v for k, v in doc.items() if v not in (None, "", {}, [], ())}


def set_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A LinuxContainerResources document without its unset fields (proto3's zero values)."""
    return _drop_empty({k: v for k, v in doc.items() if v != 0 or isinstance(v, bool)})


def load_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a JSON file that must hold one object.

    Raises InvalidArgument naming the file when it cannot be read, is not valid JSON (not UTF-8,
    nested too deeply: see :func:`shim.lib.files.decode_json`) or is not an object (a config
    file is the caller's argument, so a bad one is their error).
    """
    path = os.fspath(path)
    try:
        doc = read_json(path)
    except OSError as exc:
        raise InvalidArgument(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{path} must hold a JSON object, not {_type_name(doc)}")
    return doc


@dataclass(frozen=True)
class PodSandboxMetadata:
    """Who a pod is. ``key`` is the name a pod reserves: two pods with the same one conflict."""

    name: str
    namespace: str
    uid: str
    attempt: int = 0

    @classmethod
    def from_json(cls, doc: Any, path: str = "metadata") -> PodSandboxMetadata:
        """Parse ``metadata``; InvalidArgument naming the bad field."""
        f = _Fields(doc, path)
        return cls(name=f.string("name", required=True), namespace=f.string("namespace", required=True),
                   uid=f.string("uid", required=True), attempt=f.integer("attempt", minimum=0, maximum=MAX_ATTEMPT))

    @property
    def key(self) -> str:
        """containerd's sandbox name, ``name_namespace_uid_attempt`` (makeSandboxName)."""
        return f"{self.name}_{self.namespace}_{self.uid}_{self.attempt}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "uid": self.uid, "attempt": self.attempt}


@dataclass(frozen=True)
class DnsConfig:
    """``dns_config``: what the pod's resolv.conf says."""

    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, doc: Any, path: str = "dns_config") -> DnsConfig:
        f = _Fields(doc, path)
        servers, searches, options = f.str_list("servers"), f.str_list("searches"), f.str_list("options")
        for i, server in enumerate(servers):
            try:
                ipaddress.ip_address(server)
            except ValueError:
                raise InvalidArgument(f"{f.name('servers')}[{i}] {server!r} is not an IP address") from None
        # Each is one word of a resolv.conf line: a space or newline would write other lines.
        for key, words in (("searches", searches), ("options", options)):
            for i, word in enumerate(words):
                if not word or any(c.isspace() or not c.isprintable() for c in word):
                    raise InvalidArgument(f"{f.name(key)}[{i}] {word!r} must be one word, without spaces")
        return cls(servers=servers, searches=searches, options=options)

    def to_json(self) -> dict[str, Any]:
        return _drop_empty({"servers": list(self.servers), "searches": list(self.searches),
                            "options": list(self.options)})


@dataclass(frozen=True)
class PortMapping:
    """One entry of ``port_mappings``; those with a host port go to CNI plugins that declare the
    ``portMappings`` capability (portmap), as containerd passes them."""

    container_port: int
    protocol: str = "TCP"
    host_port: int = 0
    host_ip: str = ""

    @classmethod
    def from_json(cls, doc: Any, path: str) -> PortMapping:
        f = _Fields(doc, path)
        container_port = f.integer("container_port", minimum=0, maximum=_MAX_PORT)
        if container_port == 0:
            raise InvalidArgument(f"{f.name('container_port')} is required (1..{_MAX_PORT})")
        return cls(container_port=container_port, protocol=f.mode("protocol", ("TCP", "UDP", "SCTP"), "TCP", PROTOCOLS),
                   host_port=f.integer("host_port", minimum=0, maximum=_MAX_PORT), host_ip=f.string("host_ip"))

    def to_json(self) -> dict[str, Any]:
        return _drop_empty({"protocol": self.protocol, "container_port": self.container_port,
                            "host_port": self.host_port, "host_ip": self.host_ip})


@dataclass(frozen=True)
class NamespaceOptions:
    """``linux.security_context.namespace_options`` of a pod, as mode names.

    network and ipc: POD or NODE. pid: POD (containers share the pod's PID namespace),
    CONTAINER (each container has its own) or NODE. CRI's zero value is POD for all three.
    """

    network: str = "POD"
    pid: str = "POD"
    ipc: str = "POD"
    #: ``userns_options`` of mode POD: the pod's user namespace's mappings (``uids``, ``gids``); None: the host's.
    userns: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, doc: Any, path: str) -> NamespaceOptions:
        f = _Fields(doc, path)
        return cls(network=f.mode("network", ("POD", "NODE"), "POD"),
                   pid=f.mode("pid", ("POD", "CONTAINER", "NODE"), "POD"),
                   ipc=f.mode("ipc", ("POD", "NODE"), "POD"), userns=_userns(f))

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"network": self.network, "pid": self.pid, "ipc": self.ipc}
        if self.userns is not None:
            doc["userns_options"] = {"mode": "POD", **self.userns}
        return doc


def _userns(namespace_options: _Fields) -> dict[str, Any] | None:
    """The mappings of ``userns_options`` in mode POD (None: absent, or mode NODE, the host's):
    one range each of uids and gids from id 0, as kubelet sends them (InvalidArgument otherwise)."""
    if namespace_options.doc.get("userns_options") is None:
        return None
    f = namespace_options.obj("userns_options")
    if f.mode("mode", ("POD", "NODE"), "POD") == "NODE":
        if f.doc.get("uids") or f.doc.get("gids"):
            raise InvalidArgument(f"{f.path}: mode NODE (the host's user namespace) takes no mappings")
        return None
    return UserNamespace.from_payload(f.doc, f.path).to_payload()


@dataclass(frozen=True)
class PodSandboxConfig:
    """A CRI PodSandboxConfig as crictl's ``pod-config.json`` writes it."""

    metadata: PodSandboxMetadata
    hostname: str = ""
    log_directory: str = ""
    dns_config: DnsConfig = field(default_factory=DnsConfig)
    port_mappings: tuple[PortMapping, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""
    sysctls: dict[str, str] = field(default_factory=dict)
    namespace_options: NamespaceOptions = field(default_factory=NamespaceOptions)
    #: The pod's LinuxSandboxSecurityContext (privileged, the pause's user and seccomp profile, ...).
    security: ContainerSecurity = field(default_factory=ContainerSecurity)
    #: ``linux.overhead`` and ``linux.resources`` as given, without their unset (zero) fields: CRI's
    #: LinuxContainerResources for the whole pod, which :attr:`shim_pod_resources` adds up.
    overhead: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)

    @property
    def shim_pod_resources(self) -> dict[str, Any]:
        """The pod's cgroup's resources (UpdateSandbox's), as UpdatePodSandboxResources reads them:
        ``resources`` with ``overhead`` added (:func:`shim.cri.resources.pod_resources`)."""
        return pod_resources(self.overhead, self.resources)

    @property
    def host_network(self) -> bool:
        """True when the pod uses the node's network namespace (no CNI)."""
        return self.namespace_options.network == "NODE"

    @classmethod
    def from_json(cls, doc: Any) -> PodSandboxConfig:
        """Parse a pod config document; InvalidArgument naming the JSON path of a bad field, or of
        one podshim does not know or cannot apply (:mod:`shim.cri.fields`)."""
        f = _Fields(doc)
        check_fields(doc, POD_SANDBOX_CONFIG, "PodSandboxConfig")
        log_directory = f.string("log_directory")
        # Container log paths are joined under it by the daemon: a relative one would depend on
        # the daemon's working directory.
        if log_directory and not os.path.isabs(log_directory):
            raise InvalidArgument(f"log_directory {log_directory!r} must be an absolute path")
        hostname = f.string("hostname")
        if hostname:  # empty: unset, as CRI's zero value
            validate_hostname(hostname)
        linux = f.obj("linux")
        security = linux.obj("security_context")
        overhead, resources = (set_fields(linux.obj(key).doc) for key in ("overhead", "resources"))
        pod_resources(overhead, resources)  # checked now: a bad field fails the RunPodSandbox
        return cls(
            metadata=PodSandboxMetadata.from_json(f.obj("metadata", required=True).doc),
            hostname=hostname,
            log_directory=log_directory,
            dns_config=DnsConfig.from_json(f.obj("dns_config").doc),
            port_mappings=f.items("port_mappings", PortMapping.from_json),
            labels=f.labels(),
            annotations=f.annotations(),
            cgroup_parent=linux.string("cgroup_parent"),
            sysctls=linux.str_map("sysctls"),
            overhead=overhead,
            resources=resources,
            namespace_options=NamespaceOptions.from_json(security.obj("namespace_options").doc,
                                                         security.name("namespace_options")),
            security=ContainerSecurity.from_doc(security.doc, security.path),
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PodSandboxConfig:
        """Read and parse a ``pod-config.json``; InvalidArgument for a bad file or field."""
        return cls.from_json(load_json_object(path))

    def to_json(self) -> dict[str, Any]:
        """This config in crictl's spelling; ``from_json(to_json())`` gives an equal config."""
        linux = _drop_empty({
            "cgroup_parent": self.cgroup_parent,
            "sysctls": self.sysctls,
            "overhead": dict(self.overhead),
            "resources": dict(self.resources),
            "security_context": {"namespace_options": self.namespace_options.to_json(), **self.security.to_json()},
        })
        return _drop_empty({
            "metadata": self.metadata.to_json(),
            "hostname": self.hostname,
            "log_directory": self.log_directory,
            "dns_config": self.dns_config.to_json(),
            "port_mappings": [p.to_json() for p in self.port_mappings],
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "linux": linux,
        })

    def cni_runtime_config(self) -> dict[str, Any]:
        """CNI's ``runtimeConfig`` for this pod: ``portMappings`` of the mappings with a host port
        (containerd's toCNIPortMappings; one without is only informational), for plugins that
        declare the capability (portmap)."""
        mappings = [{"hostPort": p.host_port, "containerPort": p.container_port, "protocol": p.protocol.lower(),
                     "hostIP": p.host_ip} for p in self.port_mappings if p.host_port > 0]
        return {"portMappings": mappings} if mappings else {}

    def to_shim_options(self) -> dict[str, Any]:
        """The ``options`` map of the shim's CreateSandbox (protocol.md, "Sandbox options").

        The shim checks the values again (hostname length, which sysctls are namespaced);
        this adds the sandbox OOM score adjustment containerd gives the pause. A privileged pod
        says so (``linux.security_context.privileged``): its privileged containers may then open
        every device.
        """
        options: dict[str, Any] = {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "linux": {
                "sysctls": dict(self.sysctls),
                "security_context": {"namespace_options": self.namespace_options.to_json()},
                "oom_score_adj": SANDBOX_OOM_SCORE_ADJ,
            },
        }
        if self.security.privileged:  # its device cgroup allows every device (protocol.md 7.4)
            options["linux"]["security_context"]["privileged"] = True
        if self.hostname:
            options["hostname"] = self.hostname
        if self.cgroup_parent:
            options["linux"]["cgroup_parent"] = self.cgroup_parent
        return options


@dataclass(frozen=True)
class ContainerMetadata:
    """Who a container is within its pod; (name, attempt) is unique in a pod."""

    name: str
    attempt: int = 0

    @classmethod
    def from_json(cls, doc: Any, path: str = "metadata") -> ContainerMetadata:
        """Parse a container's ``metadata``; InvalidArgument naming the bad field."""
        f = _Fields(doc, path)
        return cls(name=f.string("name", required=True), attempt=f.integer("attempt", minimum=0, maximum=MAX_ATTEMPT))

    @property
    def key(self) -> str:
        """``name_attempt``: the name a container reserves within its pod."""
        return f"{self.name}_{self.attempt}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "attempt": self.attempt}


def _env_item(value: Any, path: str) -> tuple[str, str]:
    f = _Fields(value, path)
    key = f.string("key", required=True)
    if "=" in key or "\0" in key:
        raise InvalidArgument(f"{f.name('key')} {key!r} must not contain '=' or NUL")
    return key, f.string("value")


@dataclass(frozen=True)
class Mount:
    """One entry of a container's ``mounts``: the node's ``host_path`` bound at ``container_path``,
    or an image volume: the root filesystem of the image ``image`` names (an ImageSpec document,
    kept as given for the status), or its directory ``image_sub_path``, read-only
    (:mod:`client.cri.imagevolumes`).

    ``propagation`` is the name of CRI's MountPropagation. ``selinux_relabel`` is kept as given;
    :func:`client.cri.mounts.container_mounts` decides what it means on this node."""

    container_path: str
    host_path: str
    readonly: bool = False
    propagation: str = "PROPAGATION_PRIVATE"
    selinux_relabel: bool = False
    recursive_read_only: bool = False
    image: Mapping[str, Any] = field(default_factory=dict, hash=False)
    image_sub_path: str = ""

    @property
    def image_reference(self) -> str:
        """The image an image volume names ("" for a host path)."""
        return str(self.image.get("image") or "")

    @classmethod
    def from_json(cls, doc: Any, path: str) -> Mount:
        f = _Fields(doc, path)
        image_spec = f.obj("image")
        image = image_spec.string("image")
        container_path, host_path = f.string("container_path", required=True), f.string("host_path", required=not image)
        for key, value in (("container_path", container_path), ("host_path", host_path)):
            if (value or key == "container_path") and (not os.path.isabs(value) or "\0" in value):
                raise InvalidArgument(f"{f.name(key)} {value!r} must be an absolute path")
        image_sub_path = f.string("image_sub_path")
        mount = cls(container_path=os.path.normpath(container_path), host_path=host_path,
                    readonly=f.boolean("readonly"), selinux_relabel=f.boolean("selinux_relabel"),
                    propagation=f.mode("propagation", tuple(PROPAGATIONS.values()), "PROPAGATION_PRIVATE",
                                       PROPAGATIONS),
                    recursive_read_only=f.boolean("recursive_read_only"),
                    image=dict(image_spec.doc) if image else {}, image_sub_path=image_sub_path)
        # As containerd: every mount below a recursive read-only one is read-only for good, so it
        # must be read-only itself and receive no mount from the host.
        if mount.recursive_read_only and not mount.readonly:
            raise InvalidArgument(f"{f.name('recursive_read_only')} needs readonly to be true as well")
        if mount.recursive_read_only and mount.propagation != "PROPAGATION_PRIVATE":
            raise InvalidArgument(f"{f.name('recursive_read_only')} needs propagation PROPAGATION_PRIVATE, "
                                  f"not {mount.propagation}")
        # As containerd's mutateImageMount: an image volume is the image's files, read-only.
        if image and host_path:
            raise InvalidArgument(f"{path} names both an image ({image!r}) and host_path {host_path!r}: an image "
                                  "volume has no host path")
        if image and not mount.readonly:
            raise InvalidArgument(f"{path} is an image volume ({image!r}), which is read-only: readonly must be true")
        if image_sub_path and not image:
            raise InvalidArgument(f"{f.name('image_sub_path')} {image_sub_path!r} needs an image volume "
                                  "(image.image)")
        if image_sub_path and ("\0" in image_sub_path or os.path.isabs(image_sub_path)):
            raise InvalidArgument(f"{f.name('image_sub_path')} {image_sub_path!r} must be a relative path in "
                                  "the image")
        if image_spec.doc and not image:
            raise InvalidArgument(f"{f.name('image')} is set but names no image (image.image is empty)")
        return mount

    def to_json(self) -> dict[str, Any]:
        return _drop_empty({"container_path": self.container_path, "host_path": self.host_path,
                            "readonly": self.readonly or None, "selinux_relabel": self.selinux_relabel or None,
                            "propagation": self.propagation,
                            "recursive_read_only": self.recursive_read_only or None,
                            "image": dict(self.image), "image_sub_path": self.image_sub_path})


@dataclass(frozen=True)
class Device:
    """One entry of a container's ``devices``: the node's device ``host_path`` (or a directory of
    them) made at ``container_path`` in the container, which may use it as ``permissions`` say
    (some of r, w, m; checked, and the host path resolved, by the shim at Task.Create)."""

    container_path: str
    host_path: str
    permissions: str = ""

    @classmethod
    def from_json(cls, doc: Any, path: str) -> Device:
        f = _Fields(doc, path)
        return cls(container_path=f.string("container_path", required=True),
                   host_path=f.string("host_path", required=True), permissions=f.string("permissions"))

    def to_json(self) -> dict[str, Any]:
        return _drop_empty({"container_path": self.container_path, "host_path": self.host_path,
                            "permissions": self.permissions})


def _cdi_device(doc: Any, path: str) -> str:
    name = _Fields(doc, path).string("name", required=True)
    parse_cdi_name(name)
    return name


def _stop_signal(doc: Mapping[str, Any]) -> int | None:
    try:
        return cri_signal(doc.get("stop_signal"))
    except ValueError as exc:
        raise InvalidArgument(f"stop_signal: {exc}") from None


@dataclass(frozen=True)
class ContainerConfig:
    """A CRI ContainerConfig as crictl's ``container-config.json`` writes it.

    ``image`` is the image the container runs on (empty: a root of its own, empty but for its mounts);
    ``command`` and ``args`` override its entrypoint and command as kubelet specifies
    (:mod:`client.cri.process`). ``pid_mode`` is POD (share the pod's PID namespace),
    CONTAINER (a PID namespace of its own), NODE (the host's) or TARGET (the one of container
    ``target_id``, of the same pod). Unset it is POD: CRI's NamespaceMode is a proto3
    enum whose zero value is POD, and containerd reads an absent ``namespace_options`` so
    (kubelet always sets it: CONTAINER unless the pod shares its process namespace).
    """

    metadata: ContainerMetadata
    image: str = ""
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    working_dir: str = ""
    envs: tuple[tuple[str, str], ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    log_path: str = ""
    pid_mode: str = "POD"
    target_id: str = ""  # pid_mode TARGET: the container whose pid namespace this one joins
    #: The network and IPC modes kubelet says again for each container: POD, or the pod's own (the
    #: container joins the pod's namespaces; the pod layer refuses another mode).
    network_mode: str = "POD"
    ipc_mode: str = "POD"
    userns: dict[str, Any] | None = None  # namespace_options.userns_options in mode POD: its mappings
    mounts: tuple[Mount, ...] = ()
    devices: tuple[Device, ...] = ()
    #: ``CDI_devices``: the fully qualified names of CDI devices (:mod:`client.cri.cdi` resolves them).
    cdi_devices: tuple[str, ...] = ()
    readonly_rootfs: bool = False
    security: ContainerSecurity = field(default_factory=ContainerSecurity)
    stdin: bool = False  # its stdin stays open through the shim, for attach
    stdin_once: bool = False  # ... until the first attach that wrote to it detaches
    tty: bool = False
    #: ``linux.resources`` as given, without its unset (zero) fields: CRI's LinuxContainerResources,
    #: which :func:`shim.cri.resources.shim_resources` makes the task's Create ``resources``.
    resources: dict[str, Any] = field(default_factory=dict)
    #: ``stop_signal``: the signal StopContainer sends first; None: the image's, else SIGTERM.
    stop_signal: int | None = None

    @property
    def shim_resources(self) -> dict[str, Any]:
        """The task's ``resources`` (protocol.md 7.3): what its cgroup and process get at Start."""
        return shim_resources(self.resources, "linux.resources")

    @property
    def argv(self) -> tuple[str, ...]:
        """What runs: command followed by args."""
        return self.command + self.args

    @classmethod
    def from_json(cls, doc: Any) -> ContainerConfig:
        """Parse a container config document; InvalidArgument naming the JSON path of a bad field, or
        of one podshim does not know or cannot apply (:mod:`shim.cri.fields`)."""
        f = _Fields(doc)
        check_fields(doc, CONTAINER_CONFIG, "ContainerConfig")
        command, args = f.str_list("command"), f.str_list("args")
        log_path = f.string("log_path")
        # CRI: relative to the pod's log_directory; '..' would let a container write anywhere.
        if log_path and (os.path.isabs(log_path) or ".." in log_path.split("/")):
            raise InvalidArgument(f"log_path {log_path!r} must be relative to the pod's log_directory, without '..'")
        working_dir = f.string("working_dir")
        if working_dir and not os.path.isabs(working_dir):
            raise InvalidArgument(f"working_dir {working_dir!r} must be an absolute path")
        linux = f.obj("linux")
        resources = linux.obj("resources").doc
        shim_resources(resources, linux.name("resources"))  # checked now: a bad field fails the create
        security = linux.obj("security_context")
        namespace_options = security.obj("namespace_options")
        pid_mode = namespace_options.mode("pid", ("POD", "CONTAINER", "NODE", "TARGET"), "POD")
        network_mode = namespace_options.mode("network", ("POD", "NODE"), "POD")
        ipc_mode = namespace_options.mode("ipc", ("POD", "NODE"), "POD")
        target_id = namespace_options.string("target_id")
        if (pid_mode == "TARGET") != bool(target_id):
            raise InvalidArgument(f"{namespace_options.name('target_id')} is required with pid mode TARGET, "
                                  "and only with it")
        mounts = f.items("mounts", Mount.from_json)
        seen: dict[str, int] = {}
        for i, mount in enumerate(mounts):
            if mount.container_path in seen:
                raise InvalidArgument(f"mounts[{i}] and mounts[{seen[mount.container_path]}] are both mounted at "
                                      f"{mount.container_path}")
            seen[mount.container_path] = i
        return cls(
            metadata=ContainerMetadata.from_json(f.obj("metadata", required=True).doc),
            image=f.obj("image").string("image"),
            command=command,
            args=args,
            working_dir=working_dir,
            envs=f.items("envs", _env_item),
            labels=f.labels(),
            annotations=f.annotations(),
            log_path=log_path,
            pid_mode=pid_mode,
            target_id=target_id,
            network_mode=network_mode,
            ipc_mode=ipc_mode,
            userns=_userns(namespace_options),
            mounts=mounts,
            devices=f.items("devices", Device.from_json),
            cdi_devices=f.items("CDI_devices", _cdi_device),
            readonly_rootfs=security.boolean("readonly_rootfs"),
            security=ContainerSecurity.from_doc(security.doc, security.path),
            stdin=f.boolean("stdin"),
            stdin_once=f.boolean("stdin_once"),
            tty=f.boolean("tty"),
            resources=set_fields(resources),
            stop_signal=_stop_signal(doc),
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ContainerConfig:
        """Read and parse a ``container-config.json``; InvalidArgument for a bad file or field."""
        return cls.from_json(load_json_object(path))

    def to_json(self) -> dict[str, Any]:
        """This config in crictl's spelling; ``from_json(to_json())`` gives an equal config."""
        return _drop_empty({
            "metadata": self.metadata.to_json(),
            "image": _drop_empty({"image": self.image}),
            "command": list(self.command),
            "args": list(self.args),
            "working_dir": self.working_dir,
            "envs": [{"key": k, "value": v} for k, v in self.envs],
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "log_path": self.log_path,
            "mounts": [m.to_json() for m in self.mounts],
            "devices": [d.to_json() for d in self.devices],
            "CDI_devices": [{"name": name} for name in self.cdi_devices],
            "stdin": self.stdin or None,
            "stdin_once": self.stdin_once or None,
            "tty": self.tty or None,
            "linux": _drop_empty({"resources": dict(self.resources),
                                  "security_context": _drop_empty({"namespace_options": _drop_empty({
                                      "pid": self.pid_mode, "target_id": self.target_id,
                                      "network": None if self.network_mode == "POD" else self.network_mode,
                                      "ipc": None if self.ipc_mode == "POD" else self.ipc_mode,
                                      "userns_options": None if self.userns is None else {"mode": "POD", **self.userns}}),
                                      "readonly_rootfs": self.readonly_rootfs or None, **self.security.to_json()})}),
            "stop_signal": None if self.stop_signal is None else cri_signal_name(self.stop_signal),
        })
