"""Every field of CRI's ContainerConfig and PodSandboxConfig, and what podshim does with it.

Each field (by its path in the message, as crictl's JSON and protobuf's JSON with proto names
spell it) is one of:

- **applied**: podshim does what it asks (the text says where);
- **informs**: it asks nothing of a runtime (metadata about the image),
  and the text says why nothing is done;
- **refused**: podshim cannot do what it asks: a value that asks for something (by default, any
  value but the field's zero value) is refused with INVALID_ARGUMENT and the text.

:func:`check` walks a config document against the table before anything reads it
(:class:`shim.cri.configs.ContainerConfig` and :class:`~shim.cri.configs.PodSandboxConfig`
call it), so a field the table does not name is refused too: nothing a client sends can vanish
without a word. The fields of a refused or informing message are covered by it. A test walks the
generated CRI messages (``shim.cri.api.api_pb2``) and fails on a field the table does not name;
docs/cri.md's table is :func:`markdown`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from shim.rpc.status import InvalidArgument

__all__ = ["APPLIED", "INFORMS", "REFUSED", "Field", "CONTAINER_CONFIG", "POD_SANDBOX_CONFIG", "walk", "check",
           "markdown"]

APPLIED, INFORMS, REFUSED = "applied", "informs", "refused"


def _zero(value: Any) -> bool:
    """Whether ``value`` is proto3's zero value (also inside a message: every field zero). An enum's
    zero is its number 0 (protobuf's JSON leaves a zero enum out; crictl's files write numbers)."""
    if isinstance(value, bool):
        return not value
    if value is None or value == 0 or value == "":
        return True
    if isinstance(value, Mapping):
        return all(_zero(v) for v in value.values())
    if isinstance(value, list):
        return not value
    return False


@dataclass(frozen=True)
class Field:
    """What podshim does with one field: ``kind`` (applied, informs, refused) and ``text`` (where
    it is applied, why it asks nothing, or why it is refused). A refused field is refused when
    ``asks(value)`` (default: the value is not the field's zero value). ``leaf``: a map (labels,
    sysctls), whose keys are the client's, not fields. ``handlers``: the runtime handlers that
    apply an applied field (empty: every one); another refuses it (the shim says so), and its
    feature in Status is false for it."""

    kind: str
    text: str
    asks: Callable[[Any], bool] | None = None
    leaf: bool = False
    handlers: tuple[str, ...] = ()

    def applied_by(self, handler: str) -> bool:
        """Whether runtime handler ``handler`` (native, runc, crun) applies this field."""
        return self.kind == APPLIED and (not self.handlers or handler in self.handlers)


def _applied(text: str) -> Field:
    return Field(APPLIED, text)


def _applied_map(text: str) -> Field:
    return Field(APPLIED, text, leaf=True)


def _informs(text: str) -> Field:
    return Field(INFORMS, text)


def _refused(text: str, asks: Callable[[Any], bool] | None = None) -> Field:
    return Field(REFUSED, text, asks)


def _mode(value: Any) -> str:
    """A NamespaceMode given as its number or its name, as its name."""
    names = {0: "POD", 1: "CONTAINER", 2: "NODE", 3: "TARGET"}
    return names.get(value, "") if isinstance(value, int) else str(value).upper()


_USERNS_POD = _applied("mode POD: the pod's user namespace, of the mappings in `uids` and `gids` (one range each, "
                       "from id 0, as kubelet sends), on every handler; NODE: the host's; CONTAINER is refused")
_USERNS_CONTAINER = _applied("a container joins the pod's user namespace: another mode or other mappings than the "
                             "pod's are refused")
_USERNS_PARTS = {
    "userns_options.mode": _applied("POD or NODE"),
    "userns_options.uids": _applied("the uid mapping"),
    "userns_options.gids": _applied("the gid mapping"),
    **{f"userns_options.{kind}.{part}": _applied(text)
       for kind in ("uids", "gids") for part, text in (("container_id", "from id (0)"), ("host_id", "to host id"),
                                                       ("length", "of ids"))},
}
_NO_APPARMOR = "AppArmor is not supported: only Unconfined (shim.cri.security.refuse_lsm refuses any profile)"
_NO_SELINUX = "SELinux is not supported: an SELinux context is refused (shim.cri.security.refuse_lsm)"
_WINDOWS = _refused("a Windows setting: this is a Linux runtime")
_RESOURCE_FILES = {
    "cpu_period": "cpu.cfs_period_us",
    "cpu_quota": "cpu.cfs_quota_us",
    "cpu_shares": "cpu.shares",
    "memory_limit_in_bytes": "memory.limit_in_bytes",
    "memory_swap_limit_in_bytes": "memory.memsw.limit_in_bytes",
    "cpuset_cpus": "cpuset.cpus",
    "cpuset_mems": "cpuset.mems",
    "hugepage_limits": "hugetlb.<size>.limit_in_bytes",
}


def _resources(whose: str, pod: bool) -> dict[str, Field]:
    """A LinuxContainerResources' fields, written to ``whose`` cgroup (a pod's: ``pod``)."""
    fields: dict[str, Field] = {name: _applied(f"{file} of {whose} cgroup")
                                for name, file in _RESOURCE_FILES.items()}
    fields["hugepage_limits.page_size"] = _applied("the page size of the limit")
    fields["hugepage_limits.limit"] = _applied("the limit")
    fields["oom_score_adj"] = (_refused("an OOM score is a process's: each container's is its own") if pod
                               else _applied("the container's process (/proc/<pid>/oom_score_adj)"))
    fields["unified"] = _applied_map(f"those files of {whose} cgroup v2 directory (refused where their "
                                     "controller is not on cgroup v2)")
    return fields


def _namespace_option(container: bool) -> dict[str, Field]:
    who = "container" if container else "pod"
    fields = {
        "network": _applied("the pod's network namespace (NODE: the host's); a container joins the pod's"
                            if not container else "a container joins the pod's network namespace: another "
                            "mode than POD or the pod's own is refused"),
        "pid": _applied(f"the {who}'s pid namespace: POD, CONTAINER, NODE or TARGET" if container
                        else "the pod's pid namespace: POD (shared by its containers), CONTAINER (each its own) "
                        "or NODE"),
        "ipc": _applied("the pod's IPC namespace (NODE: the host's)" if not container else
                        "a container joins the pod's IPC namespace: another mode than POD or the pod's own is "
                        "refused"),
        "target_id": _applied("the container whose pid namespace a TARGET container joins") if container
        else _refused("a pod cannot join another's pid namespace"),
        "userns_options": _USERNS_CONTAINER if container else _USERNS_POD,
        **_USERNS_PARTS,
    }
    return fields


def _prefixed(prefix: str, fields: Mapping[str, Field]) -> dict[str, Field]:
    return {f"{prefix}.{name}": field for name, field in fields.items()}


_SECURITY_COMMON = {
    "selinux_options": _applied(_NO_SELINUX),
    **{f"selinux_options.{part}": _applied("refused when set") for part in ("user", "role", "type", "level")},
    "run_as_user": _applied("the user of the process"),
    "run_as_user.value": _applied("the uid"),
    "run_as_group": _applied("the group of the process (with run_as_user only)"),
    "run_as_group.value": _applied("the gid"),
    "readonly_rootfs": _applied("the root filesystem is mounted read-only"),
    "supplemental_groups": _applied("the process's supplementary groups, with the image's groups of its user"),
    "supplemental_groups_policy": _applied("Merge (the default) adds the groups the image's /etc/group lists the "
                                           "user in; Strict only the primary group and supplemental_groups"),
    "privileged": _applied("a privileged pod / container (every capability and device, nothing masked)"),
    "seccomp": _applied("the seccomp profile (RuntimeDefault, Unconfined or Localhost)"),
    "seccomp.profile_type": _applied("which profile"),
    "seccomp.localhost_ref": _applied("the node's profile file (Localhost)"),
    "apparmor": _applied(_NO_APPARMOR),
    "apparmor.profile_type": _applied("Unconfined only"),
    "apparmor.localhost_ref": _applied("refused with any profile"),
    "seccomp_profile_path": _applied("the seccomp profile, in its deprecated spelling"),
}

#: ContainerConfig (CreateContainerRequest.config), field by field.
CONTAINER_CONFIG: dict[str, Field] = {
    "metadata": _applied("the container's name and attempt (unique in its pod)"),
    "metadata.name": _applied("the container's name"),
    "metadata.attempt": _applied("the container's attempt"),
    "image": _applied("the image the container runs"),
    "image.image": _applied("the image's reference or id, looked up in the node's image store"),
    "image.annotations": _refused("no image annotation chooses among the store's images here"),
    "image.user_specified_image": _informs("the image as the pod's spec names it; `image` is what runs"),
    "image.runtime_handler": _refused("images are the node's, not a runtime handler's"),
    "image.image_ref": _informs("the digest of the image `image` names, for kubelet's status"),
    "command": _applied("the process's command (the image's entrypoint when empty)"),
    "args": _applied("the process's arguments (the image's command when empty)"),
    "working_dir": _applied("the process's working directory"),
    "envs": _applied("the process's environment, after the image's"),
    "envs.key": _applied("a variable's name"),
    "envs.value": _applied("its value"),
    "mounts": _applied("host paths bound into the container"),
    "mounts.container_path": _applied("where it is mounted"),
    "mounts.host_path": _applied("what is mounted"),
    "mounts.readonly": _applied("mounted read-only"),
    "mounts.selinux_relabel": _applied("accepted where SELinux is off (nothing to relabel), else refused"),
    "mounts.propagation": _applied("the mount's propagation (private, host to container, bidirectional)"),
    "mounts.uidMappings": _refused("ID-mapped mounts are not supported"),
    "mounts.gidMappings": _refused("ID-mapped mounts are not supported"),
    "mounts.recursive_read_only": _applied("every mount below it read-only too (mount_setattr with AT_RECURSIVE; "
                                           "OCI's `rro`); needs readonly and PROPAGATION_PRIVATE"),
    "mounts.image": _applied("an image volume: the image's root filesystem, read-only (a read-only view of its "
                             "layers, one per pod and image, kept while a container of the pod uses it); needs "
                             "readonly and no host_path; the image must be in the store (kubelet pulls it first)"),
    "mounts.image.image": _applied("the image's id or reference, looked up in the node's image store"),
    "mounts.image.annotations": _informs("kubelet sends the pod's annotations; none chooses among the store's images"),
    "mounts.image.user_specified_image": _informs("the image as the pod's spec names it; `image` is what is mounted"),
    "mounts.image.runtime_handler": _informs("kubelet sends the pod's runtime handler; images are the node's"),
    "mounts.image.image_ref": _informs("an answer: ContainerStatus fills it with the image's id"),
    "mounts.image_sub_path": _applied("the directory of the image mounted instead of its root, resolved inside the "
                                      "image (no way out through `..` or a symbolic link); a missing one is refused"),
    "mounts.mount_options": _refused("bind mount options of the client's (noexec, nodev, nosuid) are not supported"),
    "devices": _applied("the node's devices made in the container and allowed by its device cgroup"),
    "devices.container_path": _applied("where the device is made in the container"),
    "devices.host_path": _applied("the node's device (or a directory of them)"),
    "devices.permissions": _applied("what the device cgroup allows: r, w, m"),
    "CDI_devices": _applied("CDI devices by fully qualified name (vendor.com/class=name), resolved with the JSON "
                            "and YAML CDI specs of config `cdi_spec_dirs`: their device nodes, mounts, env and "
                            "additional groups, OCI hooks (intelRdt and netDevices refused: docs/cdi.md)"),
    "CDI_devices.name": _applied("the device's fully qualified name; one no spec defines is refused"),
    "labels": _applied_map("the container's labels (in its status, and its task's)"),
    "annotations": _applied_map("the container's annotations (in its status)"),
    "log_path": _applied("the container's log file, below the pod's log_directory"),
    "stdin": _applied("the container's stdin stays open for attach"),
    "stdin_once": _applied("its stdin closes when the first attach that wrote to it detaches"),
    "tty": _applied("the container's stdio is a terminal"),
    "linux": _applied("the Linux settings below"),
    "linux.resources": _applied("the container's cgroup and process, before it runs"),
    **_prefixed("linux.resources", _resources("the container's", pod=False)),
    "linux.security_context": _applied("the process's confinement"),
    "linux.security_context.capabilities": _applied("capabilities added to and dropped from the default set"),
    "linux.security_context.capabilities.add_capabilities": _applied("added"),
    "linux.security_context.capabilities.drop_capabilities": _applied("dropped"),
    "linux.security_context.capabilities.add_ambient_capabilities": _refused("ambient capabilities are not "
                                                                             "supported"),
    "linux.security_context.namespace_options": _applied("the container's namespaces"),
    **_prefixed("linux.security_context.namespace_options", _namespace_option(container=True)),
    **_prefixed("linux.security_context", _SECURITY_COMMON),
    "linux.security_context.run_as_username": _applied("the user of the process, by name in the image"),
    "linux.security_context.no_new_privs": _applied("PR_SET_NO_NEW_PRIVS"),
    "linux.security_context.masked_paths": _applied("paths masked in the container"),
    "linux.security_context.readonly_paths": _applied("paths made read-only in the container"),
    "linux.security_context.apparmor_profile": _applied(_NO_APPARMOR),
    "windows": _WINDOWS,
    "stop_signal": _applied("the signal StopContainer sends first (RUNTIME_DEFAULT: the image's StopSignal, else "
                            "SIGTERM)"),
}

#: PodSandboxConfig (RunPodSandboxRequest.config), field by field.
POD_SANDBOX_CONFIG: dict[str, Field] = {
    "metadata": _applied("who the pod is: its name, namespace, uid and attempt"),
    "metadata.name": _applied("the pod's name"),
    "metadata.uid": _applied("the pod's uid"),
    "metadata.namespace": _applied("the pod's namespace"),
    "metadata.attempt": _applied("the pod's attempt"),
    "hostname": _applied("the pod's hostname (its UTS namespace, /etc/hostname)"),
    "log_directory": _applied("where its containers' logs go"),
    "dns_config": _applied("the pod's /etc/resolv.conf"),
    "dns_config.servers": _applied("nameserver lines"),
    "dns_config.searches": _applied("the search line"),
    "dns_config.options": _applied("the options line"),
    "port_mappings": _applied("host ports, through the CNI portmap plugin"),
    "port_mappings.protocol": _applied("the mapping's protocol"),
    "port_mappings.container_port": _applied("the pod's port"),
    "port_mappings.host_port": _applied("the node's port"),
    "port_mappings.host_ip": _applied("the node's address"),
    "labels": _applied_map("the pod's labels (in its status)"),
    "annotations": _applied_map("the pod's annotations (in its status)"),
    "linux": _applied("the Linux settings below"),
    "linux.cgroup_parent": _applied("the parent of the pod's cgroup"),
    "linux.security_context": _applied("the pod's namespaces and its pause's confinement"),
    "linux.security_context.namespace_options": _applied("the pod's namespaces"),
    **_prefixed("linux.security_context.namespace_options", _namespace_option(container=False)),
    **_prefixed("linux.security_context", _SECURITY_COMMON),
    "linux.sysctls": _applied_map("namespaced sysctls of the pod"),
    "linux.overhead": _applied("added to each limit and weight `linux.resources` sets (not to a cpuset or "
                               "`unified`), as UpdatePodSandboxResources adds them"),
    **_prefixed("linux.overhead", {**_resources("the pod's", pod=True), **{
        name: _refused(f"an overhead adds quantities, and {name} is not one: the pod's goes in linux.resources")
        for name in ("cpuset_cpus", "cpuset_mems", "unified")}}),
    "linux.resources": _applied("the pod's cgroup (the pause's, every container's below it), before any "
                                "container runs, as UpdatePodSandboxResources writes them"),
    **_prefixed("linux.resources", _resources("the pod's", pod=True)),
    "windows": _WINDOWS,
}


def walk(doc: Any, table: Mapping[str, Field], name: Callable[[str], str] = str, _prefix: str = "",
         _where: str = "") -> Iterator[tuple[str, str, Field | None, str, Mapping[str, Any]]]:
    """Each field of ``doc`` at any depth, as (where, path, field, key, the mapping it is in): ``where``
    as the document spells it (``mounts[1].readonly``), ``path`` the table's key, ``field`` None for a key
    the table does not know (which is not descended into). ``name(key)`` is the key as the table spells
    it. A map's keys (labels) are not fields: a map is yielded, its entries are not."""
    if not isinstance(doc, Mapping):
        return
    for key, value in doc.items():
        path, where = f"{_prefix}{name(key)}", f"{_where}{key}"
        field = table.get(path)
        yield where, path, field, key, doc
        if field is not None and field.kind == APPLIED and not field.leaf:
            if isinstance(value, Mapping):
                yield from walk(value, table, name, f"{path}.", f"{where}.")
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    yield from walk(item, table, name, f"{path}.", f"{where}[{i}].")


def check(doc: Any, table: Mapping[str, Field], message: str) -> None:
    """Refuse (InvalidArgument, naming the field) a field of ``doc`` that ``table`` does not know
    or refuses, at any depth; ``message`` names the message in the sentence. Types and values of
    the fields applied are left to their readers."""
    for where, _, field, key, parent in walk(doc, table):
        value = parent[key]
        if field is None:
            raise InvalidArgument(f"{where} is not a field of CRI's {message} that podshim knows")
        if field.kind == REFUSED:
            if field.asks(value) if field.asks is not None else not _zero(value):
                raise InvalidArgument(f"{where} cannot be applied: {field.text}")


def markdown() -> str:
    """The table of both messages for docs/cri.md: every field, what podshim does with it."""
    lines = []
    for title, table in (("ContainerConfig", CONTAINER_CONFIG), ("PodSandboxConfig", POD_SANDBOX_CONFIG)):
        lines += ["", f"#### {title}", "", "| field | | |", "|---|---|---|"]
        lines += [f"| `{path}` | {field.kind} | {field.text} |" for path, field in table.items()]
    return "\n".join(lines[1:]) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
