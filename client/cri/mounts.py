"""A container's CRI ``mounts`` (and the pod's files) as the shim's Task.Create ``mounts``.

As containerd's CRI plugin (``WithMounts``, ``containerMounts``):

- a host path that does not exist is made as a directory (0755, parents too); a symbolic link is
  resolved on the node, so the container gets what it points to;
- every mount is a recursive bind (``rbind``) with its propagation: PROPAGATION_PRIVATE is
  ``rprivate``, HOST_TO_CONTAINER ``rslave``, BIDIRECTIONAL ``rshared``; ``ro`` when read-only,
  and ``rro`` when recursively read-only (every mount below the bind read-only too);
- ``selinux_relabel``: podshim cannot relabel, so on a node where SELinux is enabled it is refused
  (a container that would be denied its volume); where it is not, no label is enforced and there
  is nothing to relabel, as containerd's ``label.Relabel`` does nothing there (critest's volume
  specs ask for it on every node);
- ``rslave`` needs the host path to be on a shared or slave mount and ``rshared`` on a shared one
  (else nothing would propagate): checked in /proc/self/mountinfo, refused with a sentence naming
  the mount point otherwise (containerd's ``ensureSharedOrSlave``/``ensureShared``);
- the pod's /etc/hosts, /etc/resolv.conf and /etc/hostname come first, each unless the CRI config
  mounts something at that path (kubelet mounts its own /etc/hosts); they are read-only when the
  container's root filesystem is.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from shim.cri.configs import Mount
from shim.lib import mountinfo as mount_table
from shim.rpc.status import FailedPrecondition, InvalidArgument

__all__ = ["PROPAGATION_OPTIONS", "container_mounts", "host_mount", "wire_mount"]

#: Present where SELinux is enabled (selinuxfs mounted), as libselinux's is_selinux_enabled looks.
SELINUX_ENFORCE = "/sys/fs/selinux/enforce"
#: The bind propagation of each CRI MountPropagation.
PROPAGATION_OPTIONS = {"PROPAGATION_PRIVATE": "rprivate", "PROPAGATION_HOST_TO_CONTAINER": "rslave",
                       "PROPAGATION_BIDIRECTIONAL": "rshared"}
#: Mode of a host directory made for a mount whose host path was missing (containerd's).
_MADE_DIR_MODE = 0o755


def host_mount(path: str, mounts: Iterable[mount_table.MountEntry]) -> mount_table.MountEntry:
    """The mount ``path`` (absolute, symbolic links resolved) is on: the last one listed whose
    mount point is ``path`` or one of its parents."""
    found = None
    for mount in mounts:
        point = mount.mount_point
        if path == point or point == "/" or path.startswith(point.rstrip("/") + "/"):
            if found is None or len(point) >= len(found.mount_point):
                found = mount
    if found is None:  # every mountinfo lists "/"; a namespace without one is no place to run
        raise FailedPrecondition(f"no mount holds {path} in {mount_table.MOUNTINFO}")
    return found


def _check_propagation(mount: Mount, source: str, mountinfo: list[mount_table.MountEntry]) -> None:
    if mount.propagation == "PROPAGATION_PRIVATE":
        return
    on = host_mount(source, mountinfo)
    if mount.propagation == "PROPAGATION_BIDIRECTIONAL" and not on.shared:
        raise FailedPrecondition(f"mount {mount.container_path}: path {mount.host_path!r} is mounted on "
                                 f"{on.mount_point!r} but it is not a shared mount (BIDIRECTIONAL propagation "
                                 f"needs one: mount --make-shared {on.mount_point})")
    if mount.propagation == "PROPAGATION_HOST_TO_CONTAINER" and not (on.shared or on.slave):
        raise FailedPrecondition(f"mount {mount.container_path}: path {mount.host_path!r} is mounted on "
                                 f"{on.mount_point!r} but it is not a shared or slave mount (HOST_TO_CONTAINER "
                                 f"propagation needs one: mount --make-rshared or --make-rslave {on.mount_point})")


def _host_source(mount: Mount) -> str:
    """The host path, made as a directory when missing, with its symbolic links resolved."""
    try:
        os.lstat(mount.host_path)
    except FileNotFoundError:
        try:
            os.makedirs(mount.host_path, _MADE_DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise FailedPrecondition(f"mount {mount.container_path}: cannot make the missing host path "
                                     f"{mount.host_path}: {exc.strerror}") from None
    except OSError as exc:
        raise FailedPrecondition(f"mount {mount.container_path}: cannot use host path {mount.host_path}: "
                                 f"{exc.strerror}") from None
    source = os.path.realpath(mount.host_path)
    if not os.path.exists(source):
        raise FailedPrecondition(f"mount {mount.container_path}: host path {mount.host_path} is a symbolic link to "
                                 f"{source}, which does not exist")
    return source


def wire_mount(destination: str, source: str, *, readonly: bool, propagation: str = "rprivate",
               recursive_read_only: bool = False, idmapped: bool = False) -> dict[str, Any]:
    """One Task.Create mount: a recursive bind of ``source`` at ``destination`` (``rro``: every
    mount below it read-only too; ``idmapped``: the source is id-mapped for the pod's user
    namespace already, the shim binds it as it is)."""
    return {"destination": destination, "source": source, "type": "bind",
            "options": ["rbind", propagation, *(["ro"] if readonly else []),
                        *(["rro"] if recursive_read_only else []), *(["idmapped"] if idmapped else [])]}


def container_mounts(mounts: Iterable[Mount], pod_files: Mapping[str, str], *, readonly_rootfs: bool,
                     mountinfo: str | None = None, image_sources: Mapping[str, str] | None = None,
                     idmapped: Collection[str] = ()) -> list[dict[str, Any]]:
    """Task.Create ``mounts`` for a container: ``pod_files`` (container path → node path) not
    overridden by a CRI mount, then the CRI ``mounts`` in their order. ``mountinfo`` is the text of
    /proc/self/mountinfo (read when needed and not given). ``image_sources`` (container path →
    node path) are what the image volumes bind (:mod:`client.cri.imagevolumes`), those of the container
    paths in ``idmapped`` id-mapped for the pod's user namespace already. Makes missing host
    paths; raises FailedPrecondition for a host path that cannot be used or has the wrong
    propagation."""
    mounts = list(mounts)
    relabelled = [m.container_path for m in mounts if m.selinux_relabel]
    if relabelled and os.path.exists(SELINUX_ENFORCE):
        raise FailedPrecondition(f"mount {relabelled[0]}: selinux_relabel is set and SELinux is enabled on this node, "
                                 "but podshim cannot relabel files: the container would be denied its volume")
    wanted = {m.container_path for m in mounts}
    out = [wire_mount(path, source, readonly=readonly_rootfs)
           for path, source in pod_files.items() if path not in wanted]
    table: list[mount_table.MountEntry] | None = None
    for mount in mounts:
        if mount.image_reference:
            if image_sources is None or mount.container_path not in image_sources:
                raise FailedPrecondition(f"mount {mount.container_path}: its image volume is not mounted")
            source = image_sources[mount.container_path]
        else:
            source = _host_source(mount)
        if mount.propagation != "PROPAGATION_PRIVATE" and table is None:
            if mountinfo is None:
                with open(mount_table.MOUNTINFO) as f:
                    mountinfo = f.read()
            table = mount_table.parse(mountinfo)
        if table is not None:
            _check_propagation(mount, source, table)
        if mount.propagation not in PROPAGATION_OPTIONS:
            raise InvalidArgument(f"mount {mount.container_path}: unknown propagation {mount.propagation!r}")
        out.append(wire_mount(mount.container_path, source, readonly=mount.readonly,
                              propagation=PROPAGATION_OPTIONS[mount.propagation],
                              recursive_read_only=mount.recursive_read_only,
                              idmapped=mount.container_path in idmapped))
    return out
