"""CRI's LinuxContainerSecurityContext, and what containerd's CRI makes of it: the process
confinement fields of Task.Create (protocol.md 7.3: ``user``, ``capabilities``,
``no_new_privileges``, ``seccomp``; and for the filesystem ``privileged``, ``masked_paths``,
``readonly_paths``).

Parsing (:meth:`ContainerSecurity.from_fields`) is pure; :func:`task_fields` reads only through
the callables it is given: ``read_file(path) -> bytes | None`` for the container's /etc/passwd
and /etc/group (the image's snapshot, or the node's for a container without an image), and the Localhost seccomp profile
files. Every error is :class:`~shim.rpc.status.InvalidArgument` naming the field.

containerd's semantics, field by field (internal/cri/server/container_create*.go, opts, pkg/oci):

- capabilities: the default set (:data:`shim.runtime.confine.DEFAULT_CAPABILITIES`); then "ALL" in
  ``add_capabilities`` makes it every capability this runtime holds, "ALL" in
  ``drop_capabilities`` makes it empty, then the other names are added, then dropped (names
  without ``CAP_``, any case).
- privileged: refused unless the pod is privileged; every capability this runtime holds, no
  seccomp filter, no masked or read-only paths (``privileged`` on the wire does the rest).
- user: ``run_as_username``, else ``run_as_user``, else the image's User, else 0; a numeric uid
  takes its group from /etc/passwd (0 when it has no entry), a name must be there;
  ``run_as_group`` replaces the group and needs one of the two (CRI). The supplementary groups
  are the primary group, the groups of /etc/group that list the user by name and
  ``supplemental_groups``, sorted; ``supplemental_groups_policy`` Strict leaves out those of
  /etc/group (Merge, the default, keeps them).
- seccomp: ``seccomp`` (else the deprecated ``seccomp_profile_path``: ``runtime/default``,
  ``docker/default``, ``unconfined`` or ``localhost/<absolute path>``); absent: unconfined, as
  containerd; RuntimeDefault is :func:`shim.cri.seccomp_default.default_profile` for the
  container's capabilities; Localhost reads an OCI profile (JSON) from the node.
- AppArmor and SELinux: this host has no LSM, so a profile or label asked for is refused, never
  ignored ("unconfined" AppArmor is accepted: it is what there is).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shim.api.defaults import DEFAULT_CAPABILITIES
from shim.cri.seccomp_default import default_profile
from shim.lib import capabilities as capability_sets
from shim.lib.files import read_regular
from shim.lib.idmaps import UserNamespace, inside_id
from shim.lib.processes import read_status
from shim.rpc.status import InvalidArgument

__all__ = ["MERGE", "PROFILE_TYPES", "STRICT", "USER_FILES", "ContainerSecurity", "SecurityProfile",
           "held_capabilities", "host_read_file", "load_localhost_profile", "pause_fields", "pause_user",
           "process_user", "refuse_lsm", "resolve_user", "task_fields", "user_status"]

#: CRI's SecurityProfile.ProfileType enum.
PROFILE_TYPES = {0: "RuntimeDefault", 1: "Unconfined", 2: "Localhost"}
#: The files of the container's root filesystem a user is resolved in.
USER_FILES = ("/etc/passwd", "/etc/group")
_LOCALHOST_PREFIX = "localhost/"
_MAX_ID = 2**32 - 2
_OCI_SECCOMP_KEYS = ("defaultAction", "defaultErrnoRet", "architectures", "flags", "listenerPath",
                     "listenerMetadata", "syscalls")
_OCI_SYSCALL_KEYS = ("names", "action", "errnoRet", "args")
_OCI_ARG_KEYS = ("index", "value", "valueTwo", "op")

ReadFile = Callable[[str], "bytes | None"]


@dataclass(frozen=True)
class SecurityProfile:
    """CRI's SecurityProfile: ``profile_type`` RuntimeDefault, Unconfined or Localhost."""

    profile_type: str = "RuntimeDefault"
    localhost_ref: str = ""

    @classmethod
    def from_doc(cls, doc: Any, path: str) -> SecurityProfile:
        if not isinstance(doc, dict):
            raise InvalidArgument(f"{path} must be an object")
        kind = doc.get("profile_type", 0)
        name = PROFILE_TYPES.get(kind) if isinstance(kind, int) and not isinstance(kind, bool) else None
        if isinstance(kind, str):
            name = next((n for n in PROFILE_TYPES.values() if n.lower() == kind.lower()), None)
        if name is None:
            raise InvalidArgument(f"{path}.profile_type is {kind!r}; allowed: "
                                  + ", ".join(f"{n} ({v})" for v, n in PROFILE_TYPES.items()))
        ref = doc.get("localhost_ref") or ""
        if not isinstance(ref, str):
            raise InvalidArgument(f"{path}.localhost_ref must be a string")
        if ref and name != "Localhost":
            raise InvalidArgument(f"{path}.localhost_ref must only be set if profile_type is Localhost")
        return cls(name, ref)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"profile_type": self.profile_type}
        if self.localhost_ref:
            doc["localhost_ref"] = self.localhost_ref
        return doc


def _int64(value: Any, path: str) -> int:
    # protobuf's JSON writes int64 as a string ("1000"); crictl's files write numbers.
    if isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_ID:
        raise InvalidArgument(f"{path} must be an id in 0..{_MAX_ID}, got {value!r}")
    return value


#: CRI's SupplementalGroupsPolicy, by number.
MERGE, STRICT = "Merge", "Strict"
_GROUPS_POLICIES = {0: MERGE, 1: STRICT}


def _groups_policy(value: Any, path: str) -> str:
    """A SupplementalGroupsPolicy given as its number or its name (any case): Merge or Strict."""
    if value is None:
        return MERGE
    if isinstance(value, int) and not isinstance(value, bool) and value in _GROUPS_POLICIES:
        return _GROUPS_POLICIES[value]
    if isinstance(value, str):
        for name in _GROUPS_POLICIES.values():
            if value.lower() == name.lower():
                return name
    raise InvalidArgument(f"{path} must be Merge or Strict (0 or 1), not {value!r}")


def _int64_value(doc: Mapping[str, Any], key: str, path: str) -> int | None:
    """A google.protobuf Int64Value ``{value}`` (an empty one is 0), or None when absent."""
    wrapper = doc.get(key)
    if wrapper is None:
        return None
    if not isinstance(wrapper, dict):
        raise InvalidArgument(f"{path}.{key} must be an object {{value}}")
    return _int64(wrapper.get("value", 0), f"{path}.{key}.value")


def _strings(doc: Mapping[str, Any], key: str, path: str) -> tuple[str, ...]:
    value = doc.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"{path}.{key} must be an array of strings")
    return tuple(value)


def _string(doc: Mapping[str, Any], key: str, path: str) -> str:
    value = doc.get(key) or ""
    if not isinstance(value, str):
        raise InvalidArgument(f"{path}.{key} must be a string")
    return value


def _bool(doc: Mapping[str, Any], key: str, path: str) -> bool:
    value = doc.get(key) or False
    if not isinstance(value, bool):
        raise InvalidArgument(f"{path}.{key} must be a boolean")
    return value


@dataclass(frozen=True)
class ContainerSecurity:
    """The fields of a LinuxContainerSecurityContext this module translates (namespace options
    and readonly_rootfs are read by :class:`shim.cri.configs.ContainerConfig`)."""

    privileged: bool = False
    add_capabilities: tuple[str, ...] = ()
    drop_capabilities: tuple[str, ...] = ()
    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_username: str = ""
    supplemental_groups: tuple[int, ...] = ()
    supplemental_groups_policy: str = MERGE
    no_new_privs: bool = False
    masked_paths: tuple[str, ...] = ()
    readonly_paths: tuple[str, ...] = ()
    seccomp: SecurityProfile | None = None
    seccomp_profile_path: str = ""
    apparmor: SecurityProfile | None = None
    apparmor_profile: str = ""
    selinux_options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_doc(cls, doc: Any, path: str = "linux.security_context") -> ContainerSecurity:
        """Parse a security context (crictl's JSON, or protobuf's JSON of the CRI message);
        InvalidArgument naming the bad field."""
        if doc is None:
            return cls()
        if not isinstance(doc, dict):
            raise InvalidArgument(f"{path} must be an object")
        capabilities = doc.get("capabilities") or {}
        if not isinstance(capabilities, dict):
            raise InvalidArgument(f"{path}.capabilities must be an object")
        selinux = doc.get("selinux_options") or {}
        if not isinstance(selinux, dict):
            raise InvalidArgument(f"{path}.selinux_options must be an object")
        groups = doc.get("supplemental_groups") or []
        if not isinstance(groups, list):
            raise InvalidArgument(f"{path}.supplemental_groups must be an array")
        for key in ("masked_paths", "readonly_paths"):
            for i, item in enumerate(_strings(doc, key, path)):
                if not os.path.isabs(item):
                    raise InvalidArgument(f"{path}.{key}[{i}] {item!r} must be an absolute path")
        return cls(
            privileged=_bool(doc, "privileged", path),
            add_capabilities=_strings(capabilities, "add_capabilities", f"{path}.capabilities"),
            drop_capabilities=_strings(capabilities, "drop_capabilities", f"{path}.capabilities"),
            run_as_user=_int64_value(doc, "run_as_user", path),
            run_as_group=_int64_value(doc, "run_as_group", path),
            run_as_username=_string(doc, "run_as_username", path),
            supplemental_groups=tuple(_int64(g, f"{path}.supplemental_groups[{i}]") for i, g in enumerate(groups)),
            supplemental_groups_policy=_groups_policy(doc.get("supplemental_groups_policy"),
                                                      f"{path}.supplemental_groups_policy"),
            no_new_privs=_bool(doc, "no_new_privs", path),
            masked_paths=_strings(doc, "masked_paths", path),
            readonly_paths=_strings(doc, "readonly_paths", path),
            seccomp=None if doc.get("seccomp") is None else SecurityProfile.from_doc(doc["seccomp"], f"{path}.seccomp"),
            seccomp_profile_path=_string(doc, "seccomp_profile_path", path),
            apparmor=None if doc.get("apparmor") is None else SecurityProfile.from_doc(doc["apparmor"],
                                                                                         f"{path}.apparmor"),
            apparmor_profile=_string(doc, "apparmor_profile", path),
            selinux_options=tuple((k, _string(selinux, k, f"{path}.selinux_options"))
                                  for k in ("user", "role", "type", "level") if selinux.get(k)),
        )

    def to_json(self) -> dict[str, Any]:
        """Back in crictl's spelling (only what is set): ``from_doc(to_json())`` is equal."""
        doc: dict[str, Any] = {}
        if self.privileged:
            doc["privileged"] = True
        caps = {k: list(v) for k, v in (("add_capabilities", self.add_capabilities),
                                        ("drop_capabilities", self.drop_capabilities)) if v}
        if caps:
            doc["capabilities"] = caps
        for key in ("run_as_user", "run_as_group"):
            if getattr(self, key) is not None:
                doc[key] = {"value": getattr(self, key)}
        for key in ("run_as_username", "seccomp_profile_path", "apparmor_profile"):
            if getattr(self, key):
                doc[key] = getattr(self, key)
        for key in ("supplemental_groups", "masked_paths", "readonly_paths"):
            if getattr(self, key):
                doc[key] = list(getattr(self, key))
        if self.supplemental_groups_policy != MERGE:
            doc["supplemental_groups_policy"] = self.supplemental_groups_policy
        if self.no_new_privs:
            doc["no_new_privs"] = True
        for key in ("seccomp", "apparmor"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key).to_json()
        if self.selinux_options:
            doc["selinux_options"] = dict(self.selinux_options)
        return doc


# -- capabilities -----------------------------------------------------------------------------


def held_capabilities() -> tuple[str, ...]:
    """Every capability this process holds (containerd's cap.Current: what "ALL" and privileged give)."""
    return tuple(capability_sets.names(capability_sets.current("CapEff")))


def _cap_name(name: str) -> str:
    upper = name.upper()
    return upper if upper.startswith("CAP_") else "CAP_" + upper


def capabilities(sec: ContainerSecurity, all_caps: tuple[str, ...]) -> list[str]:
    """The container's capability list: containerd's WithCapabilities (then WithPrivileged)."""
    if sec.privileged:
        return list(all_caps)
    caps = list(DEFAULT_CAPABILITIES)
    if any(c.upper() == "ALL" for c in sec.add_capabilities):
        caps = list(all_caps)
    if any(c.upper() == "ALL" for c in sec.drop_capabilities):
        caps = []
    for name in sec.add_capabilities:
        if name.upper() != "ALL" and _cap_name(name) not in caps:
            caps.append(_cap_name(name))
    dropped = {_cap_name(name) for name in sec.drop_capabilities if name.upper() != "ALL"}
    return [c for c in caps if c not in dropped]


# -- users ------------------------------------------------------------------------------------


def _entries(read_file: ReadFile, path: str, fields: int) -> list[list[str]]:
    data = read_file(path)
    if data is None:
        return []
    entries = []
    for line in data.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(":")
        if len(parts) >= fields:
            entries.append(parts)
    return entries


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def resolve_user(userstr: str, supplemental_groups: tuple[int, ...], read_file: ReadFile, *,
                 strict: bool = False) -> dict[str, Any]:
    """The wire ``user`` for a user string as containerd's WithUser, WithAdditionalGIDs and
    WithSupplementalGroups read it: ``uid``, ``name``, ``uid:gid``, ``name:group`` (names looked up
    in the container's /etc/passwd and /etc/group through ``read_file``, which answers None for a
    missing file). ``strict`` (SupplementalGroupsPolicy Strict): no group of /etc/group that lists
    the user. InvalidArgument for a name that is not there or an id out of range."""
    user_part, _, group_part = userstr.partition(":")
    passwd = _entries(read_file, "/etc/passwd", 4)
    uid = _number(user_part)
    gid: int | None = None
    if uid is None:
        entry = next((e for e in passwd if e[0] == user_part), None)
        if entry is None or _number(entry[2]) is None:
            raise InvalidArgument(f"user {user_part!r} is not in the container's /etc/passwd")
        uid, username = int(entry[2]), user_part
        if not group_part:
            gid = _number(entry[3]) or 0
    else:
        entry = next((e for e in passwd if _number(e[2]) == uid), None)
        username = entry[0] if entry else ""
        if not group_part:
            gid = (_number(entry[3]) or 0) if entry else 0
    groups = _entries(read_file, "/etc/group", 3)
    if group_part:
        gid = _number(group_part)
        if gid is None:
            entry = next((e for e in groups if e[0] == group_part), None)
            if entry is None or _number(entry[2]) is None:
                raise InvalidArgument(f"group {group_part!r} is not in the container's /etc/group")
            gid = int(entry[2])
    for what, value in (("uid", uid), ("gid", gid)):
        if not 0 <= value <= _MAX_ID:  # type: ignore[operator]
            raise InvalidArgument(f"user {userstr!r}: {what} {value} is out of range")
    member_of = [] if strict else [int(e[2]) for e in groups
                                   if username and e[0] != username and _number(e[2]) is not None
                                   and username in (e[3].split(",") if len(e) > 3 else [])]
    return {"uid": uid, "gid": gid, "additional_gids": sorted({gid, *member_of, *supplemental_groups})}


def _userstr(sec: ContainerSecurity, image_user: str, path: str) -> str:
    """containerd's GenerateUserString, with the image's User when CRI names none."""
    if sec.run_as_group is not None and sec.run_as_user is None and not sec.run_as_username:
        raise InvalidArgument(f"{path}.run_as_group is set without run_as_user or run_as_username: "
                              "a group needs a user")
    user = sec.run_as_username or ("" if sec.run_as_user is None else str(sec.run_as_user))
    if not user:
        return image_user or "0"
    return f"{user}:{sec.run_as_group}" if sec.run_as_group is not None else user


# -- seccomp, AppArmor, SELinux -----------------------------------------------------------------


def _seccomp_profile(sec: ContainerSecurity, path: str) -> SecurityProfile | None:
    if sec.seccomp is not None:
        return sec.seccomp
    profile_path = sec.seccomp_profile_path
    if not profile_path:
        return None
    if profile_path in ("runtime/default", "docker/default"):
        return SecurityProfile("RuntimeDefault")
    if profile_path == "unconfined":
        return SecurityProfile("Unconfined")
    if not profile_path.startswith(_LOCALHOST_PREFIX):
        raise InvalidArgument(f"{path}.seccomp_profile_path {profile_path!r} is not a profile: use runtime/default, "
                              "docker/default, unconfined or localhost/<absolute path>")
    return SecurityProfile("Localhost", profile_path.removeprefix(_LOCALHOST_PREFIX))


def load_localhost_profile(ref: str, path: str, read_profile: Callable[[str], bytes]) -> dict[str, Any]:
    """The OCI ``linux.seccomp`` object in the JSON file ``ref`` (absolute; a ``localhost/``
    prefix is dropped, as containerd does). Keys that are not OCI ones are left out, as Go's
    decoder into the runtime spec does; InvalidArgument for a missing or malformed file."""
    file_path = ref.removeprefix(_LOCALHOST_PREFIX)
    if not os.path.isabs(file_path):
        raise InvalidArgument(f"{path} Localhost profile {ref!r} must be an absolute path on the node")
    try:
        doc = json.loads(read_profile(file_path))
    except OSError as exc:
        raise InvalidArgument(f"{path}: cannot read seccomp profile {file_path}: {exc.strerror}") from None
    except ValueError as exc:
        raise InvalidArgument(f"{path}: seccomp profile {file_path} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{path}: seccomp profile {file_path} must hold a JSON object")
    profile = {k: doc[k] for k in _OCI_SECCOMP_KEYS if doc.get(k) is not None}
    syscalls = profile.get("syscalls")
    if isinstance(syscalls, list):
        profile["syscalls"] = [_keep(rule, _OCI_SYSCALL_KEYS) for rule in syscalls]
        for rule in profile["syscalls"]:
            if isinstance(rule.get("args"), list):
                rule["args"] = [_keep(arg, _OCI_ARG_KEYS) for arg in rule["args"]]
    return profile


def _keep(doc: Any, keys: tuple[str, ...]) -> Any:
    return {k: doc[k] for k in keys if doc.get(k) is not None} if isinstance(doc, dict) else doc


#: The largest Localhost seccomp profile (or node user file) read: real profiles are tens of KiB.
MAX_NODE_FILE_BYTES = 4 << 20


def _read_node_file(path: str) -> bytes:
    """A file of the node a config names: a regular file of at most MAX_NODE_FILE_BYTES, read
    without blocking (a FIFO or /dev/zero is refused with a sentence, never read)."""
    return read_regular(path, MAX_NODE_FILE_BYTES)


def refuse_lsm(sec: ContainerSecurity, path: str = "linux.security_context") -> None:
    """InvalidArgument when ``sec`` asks for AppArmor or SELinux confinement (this host has no LSM)."""
    if sec.apparmor is not None and sec.apparmor.profile_type != "Unconfined":
        raise InvalidArgument(f"{path}.apparmor asks for {sec.apparmor.profile_type} AppArmor confinement, but this "
                              "host has no AppArmor (no LSM): only Unconfined can be honoured")
    if sec.apparmor_profile and sec.apparmor_profile != "unconfined":
        raise InvalidArgument(f"{path}.apparmor_profile {sec.apparmor_profile!r} cannot be applied: this host has "
                              "no AppArmor (no LSM)")
    if sec.selinux_options:
        raise InvalidArgument(f"{path}.selinux_options {dict(sec.selinux_options)} cannot be applied: this host has "
                              "no SELinux (no LSM)")


# -- the whole translation --------------------------------------------------------------------


def task_fields(sec: ContainerSecurity, *, pod_privileged: bool, read_file: ReadFile, image_user: str = "",
                all_caps: tuple[str, ...] | None = None, read_profile: Callable[[str], bytes] = _read_node_file,
                path: str = "linux.security_context") -> dict[str, Any]:
    """The Task.Create fields for a container with security context ``sec`` in a pod that is
    (``pod_privileged``) or is not privileged: ``user``, ``capabilities``, ``no_new_privileges``,
    ``seccomp`` (when confined), and ``privileged`` / ``masked_paths`` / ``readonly_paths`` (when
    given). ``all_caps`` defaults to :func:`held_capabilities`. InvalidArgument naming the field."""
    refuse_lsm(sec, path)
    if sec.privileged and not pod_privileged:
        raise InvalidArgument(f"{path}.privileged: no privileged container allowed in a sandbox that is not "
                              "privileged (linux.security_context.privileged of the pod)")
    caps = capabilities(sec, held_capabilities() if all_caps is None else all_caps)
    fields: dict[str, Any] = {
        "user": resolve_user(_userstr(sec, image_user, path), sec.supplemental_groups, read_file,
                             strict=sec.supplemental_groups_policy == STRICT),
        "capabilities": caps,
        "no_new_privileges": sec.no_new_privs,
    }
    if sec.privileged:
        fields["privileged"] = True  # all capabilities, no filter, no masked or read-only paths
        return fields
    if sec.masked_paths:
        fields["masked_paths"] = list(sec.masked_paths)
    if sec.readonly_paths:
        fields["readonly_paths"] = list(sec.readonly_paths)
    fields.update(_seccomp_field(sec, caps, path, read_profile))
    return fields


def _seccomp_field(sec: ContainerSecurity, caps: list[str], path: str,
                   read_profile: Callable[[str], bytes]) -> dict[str, Any]:
    profile = _seccomp_profile(sec, path)
    if profile is not None and profile.profile_type == "RuntimeDefault":
        return {"seccomp": default_profile(caps)}
    if profile is not None and profile.profile_type == "Localhost":
        return {"seccomp": load_localhost_profile(profile.localhost_ref, f"{path}.seccomp", read_profile)}
    return {}


def pause_fields(sec: ContainerSecurity, *, all_caps: tuple[str, ...] | None = None,
                 read_profile: Callable[[str], bytes] = _read_node_file,
                 path: str = "linux.security_context", image_user: str = "",
                 read_file: ReadFile = lambda _: None) -> dict[str, Any]:
    """The pause's confinement (CreateSandbox's ``linux.pause_process``) for a pod whose
    LinuxSandboxSecurityContext is ``sec``, as containerd's sandbox container spec: run_as_user
    and run_as_group (a group needs a user) with supplemental_groups, else the sandbox image's
    ``image_user`` (its names looked up through ``read_file``, the image's /etc/passwd and
    /etc/group), else root; no_new_privs always, the
    default capabilities (a privileged pod: every held one and no filter), the pod's seccomp
    profile. The built-in pause has no /etc/passwd: a uid's group is 0 unless run_as_group says."""
    refuse_lsm(sec, path)
    if sec.run_as_group is not None and sec.run_as_user is None:
        raise InvalidArgument(f"{path}.run_as_group is set without run_as_user: a group needs a user")
    caps = list(held_capabilities() if all_caps is None else all_caps) if sec.privileged else \
        list(DEFAULT_CAPABILITIES)
    fields: dict[str, Any] = {"user": pause_user(sec, image_user, read_file),
                              "capabilities": caps, "no_new_privileges": True}
    if not sec.privileged:
        fields.update(_seccomp_field(sec, caps, path, read_profile))
    return fields


def pause_user(sec: ContainerSecurity, image_user: str = "", read_file: ReadFile = lambda _: None) -> dict[str, Any]:
    """The ``user`` of :func:`pause_fields` (which checks ``sec`` first): run_as_user and
    run_as_group with supplemental_groups, else the sandbox image's ``image_user`` (names looked
    up through ``read_file``), else root."""
    userstr = (image_user or "0") if sec.run_as_user is None else str(sec.run_as_user)
    if sec.run_as_group is not None:
        userstr += f":{sec.run_as_group}"
    return resolve_user(userstr, sec.supplemental_groups, read_file, strict=sec.supplemental_groups_policy == STRICT)


def process_user(pid: int, status_path: str = "") -> dict[str, Any] | None:
    """CRI's ContainerUser of a running process: the real uid and gid and the supplementary groups
    it has, from ``/proc/<pid>/status`` (``status_path`` if given), as the container sees them:
    in a pod's user namespace, mapped back through its uid_map and gid_map (the host's ids are
    what /proc shows us). None once it is gone."""
    try:
        status = read_status(status_path or f"/proc/{pid}/status")
        userns = None if status_path else UserNamespace.of_process(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None
    uid, gid = int(status["Uid"].split()[0]), int(status["Gid"].split()[0])
    groups = [int(g) for g in status.get("Groups", "").split()]
    if userns is not None:
        uid, gid = inside_id(userns.uids, uid), inside_id(userns.gids, gid)
        groups = [inside_id(userns.gids, g) for g in groups]
    return user_status(uid, gid, groups)


def user_status(uid: int, gid: int, supplemental_groups: list[int]) -> dict[str, Any]:
    """CRI's ContainerUser of these ids (as the container sees them)."""
    return {"linux": {"uid": uid, "gid": gid, "supplemental_groups": supplemental_groups}}


def host_read_file(path: str) -> bytes | None:
    """``read_file`` for a container without an image (its root holds no /etc/passwd): the node's
    own file, for user names only (the container sees none of it)."""
    try:
        return _read_node_file(path)
    except FileNotFoundError:
        return None
