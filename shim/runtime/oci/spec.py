"""config.json documents for the pause and for tasks, after containerd's sandbox and container specs.

Pure functions: no I/O, nothing read from the machine (the caller passes what it learnt from
:mod:`shim.runtime.oci.host`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shim.api.defaults import DEFAULT_CAPABILITIES
from shim.kernel.cgroups import RESOURCE_FILES
from shim.kernel.devices import DEFAULT_RULES, DeviceRules, pod_rules
from shim.lib.idmaps import UserNamespace
from shim.rpc.status import InvalidArgument
from shim.runtime import pause, process
from shim.runtime.confine import Confinement, oci_rlimits
from shim.runtime.hooks import Hook, oci_hooks
from shim.runtime.mounts import MASKED_PATHS, READONLY_PATHS, HostDevice, TaskMount

__all__ = ["DEFAULT_CAPABILITIES", "MASKED_PATHS", "OCI_VERSION", "PAUSE_ARGS", "PAUSE_NAME", "READONLY_PATHS",
           "sandbox_spec", "task_spec", "with_user_namespace"]

OCI_VERSION = "1.0.2"
PAUSE_ARGS = ("/pause", "-P")  # catatonit's pause mode, from the pause rootfs
PAUSE_NAME = "pause"  # the pause's command name once exec'd (/proc/PID/status Name)
# MASKED_PATHS and READONLY_PATHS (runc's defaults) live with the native handler's mounts.

def _namespace(kind: str, path: str | None = None) -> dict[str, str]:
    return {"type": kind, "path": path} if path else {"type": kind}


def _mounts(*, own_ipc: bool, shm_size_bytes: int, privileged: bool = False,
            shm_source: str | None = None) -> list[dict[str, Any]]:
    """proc, a /dev tmpfs with devpts, /dev/shm (``shm_source``
    bound when given; else a tmpfs of its own with an own IPC namespace, the host's bound in
    otherwise, as containerd does), mqueue with an own IPC namespace, sysfs read-only
    (``privileged``: read-write)."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
    ]
    if shm_source is not None:
        mounts.append({"destination": "/dev/shm", "type": "bind", "source": shm_source,
                       "options": ["rbind", "nosuid", "nodev", "noexec"]})
    elif own_ipc:
        mounts.append({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                       "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={shm_size_bytes}"]})
    else:
        mounts.append({"destination": "/dev/shm", "type": "bind", "source": "/dev/shm",
                       "options": ["rbind", "nosuid", "nodev", "noexec"]})
    if own_ipc:
        mounts.append({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                       "options": ["nosuid", "noexec", "nodev"]})
    mounts.append({"destination": "/sys", "type": "sysfs", "source": "sysfs",
                   "options": ["nosuid", "noexec", "nodev", "rw" if privileged else "ro"]})
    return mounts


def _document(container_type: str, sandbox_id: str, process_doc: dict[str, Any], rootfs: str,
              mounts: list[dict[str, Any]], namespaces: list[dict[str, str]], cgroups_path: str | None,
              sysctls: Mapping[str, str] | None = None,
              seccomp: Mapping[str, Any] | None = None, *, readonly: bool = True,
              masked_paths: tuple[str, ...] = MASKED_PATHS,
              readonly_paths: tuple[str, ...] = READONLY_PATHS) -> dict[str, Any]:
    """A config.json: a root (read-only unless told), masked and read-only paths (runc's unless
    told), CRI's annotations."""
    linux_doc: dict[str, Any] = {"namespaces": namespaces, "maskedPaths": list(masked_paths),
                                 "readonlyPaths": list(readonly_paths)}
    if seccomp is not None:
        linux_doc["seccomp"] = dict(seccomp)
    if sysctls:
        linux_doc["sysctl"] = dict(sysctls)
    if cgroups_path:
        linux_doc["cgroupsPath"] = cgroups_path
    return {
        "ociVersion": OCI_VERSION,
        "process": process_doc,
        "root": {"path": rootfs, "readonly": readonly},
        "mounts": mounts,
        "annotations": {"io.kubernetes.cri.container-type": container_type,
                        "io.kubernetes.cri.sandbox-id": sandbox_id},
        "linux": linux_doc,
    }


def _process(args: list[str], env: list[str], cwd: str, *, confinement: Confinement,
             oom_score_adj: int | None) -> dict[str, Any]:
    """process: the confinement's user, capabilities (bounding, effective, permitted; no
    inheritable or ambient, as containerd), noNewPrivileges and rlimits."""
    caps = list(confinement.capabilities)
    user: dict[str, Any] = {"uid": confinement.uid, "gid": confinement.gid}
    if confinement.additional_gids:
        user["additionalGids"] = list(confinement.additional_gids)
    doc: dict[str, Any] = {
        "terminal": False,
        "user": user,
        "args": list(args),
        "env": list(env),
        "cwd": cwd,
        "capabilities": {"bounding": caps, "effective": list(caps), "permitted": list(caps)},
        "noNewPrivileges": confinement.no_new_privileges,
    }
    if confinement.rlimits:
        doc["rlimits"] = oci_rlimits(confinement)
    if oom_score_adj is not None:
        doc["oomScoreAdj"] = oom_score_adj
    return doc


def sandbox_spec(*, sandbox_id: str, rootfs: str, netns_path: str | None, pid_mode: str = pause.POD,
                 ipc_mode: str = pause.POD, hostname: str | None = None, sysctls: Mapping[str, str] | None = None,
                 cgroups_path: str | None = None, oom_score_adj: int | None = pause.DEFAULT_OOM_SCORE_ADJ,
                 shm_size_bytes: int = pause.DEFAULT_SHM_SIZE_BYTES,
                 confinement: Confinement | None = None, args: tuple[str, ...] = PAUSE_ARGS,
                 env: tuple[str, ...] = (), cwd: str = "/", privileged: bool = False) -> dict[str, Any]:
    """The pause container's config.json, as containerd's sandbox container spec.

    A read-only ``rootfs`` running ``args`` (default ``/pause -P``) with ``env`` (NAME=VALUE, as
    :func:`process.environment` makes it for the native handler too) in ``cwd``, confined as ``confinement`` says (None: as root
    with the default capabilities and no new privileges); new pid, ipc, uts
    and mount namespaces, joined to the network namespace ``netns_path``. NODE modes drop the
    namespace: host network (``netns_path`` None) drops network *and* uts (then ``hostname`` is
    ignored), NODE pid and ipc drop theirs (and /dev/shm is the host's). ``oom_score_adj`` None
    leaves the runtime's own. ``linux.resources.devices`` says the pod's device rules
    (:func:`shim.kernel.devices.pod_rules`; the shim has applied them already): ``privileged`` (a
    privileged pod), every device. The pause's cgroup is its tasks' cgroups' parent, and a child
    cannot allow a device its parent does not: under containerd the pod's cgroup (the kubelet's)
    allows them all and each container, the pause included, has its own rules; here the pause's
    rules are the pod's, so a privileged task could not open the host devices it is given. Its
    tasks that are not privileged still get the default rules in their own cgroups. Raises
    InvalidArgument for an unknown mode or a sysctl that is not namespaced for this sandbox.
    """
    for what, mode in (("pid_mode", pid_mode), ("ipc_mode", ipc_mode)):
        if mode not in (pause.POD, pause.NODE):
            raise InvalidArgument(f"{what} {mode!r} is not supported (POD or NODE)")
    host_network = netns_path is None
    sysctls = dict(sysctls or {})
    pause.validate_sysctls(sysctls, host_network=host_network, host_ipc=ipc_mode == pause.NODE)
    namespaces = [_namespace("mount")]
    if pid_mode == pause.POD:
        namespaces.append(_namespace("pid"))
    if ipc_mode == pause.POD:
        namespaces.append(_namespace("ipc"))
    if not host_network:
        namespaces += [_namespace("uts"), _namespace("network", netns_path)]
    confinement = confinement or Confinement(no_new_privileges=True)  # containerd's sandbox default
    doc = _document("sandbox", sandbox_id,
                    _process(list(args), [f"{name}={value}" for name, value in process.environment(env).items()], cwd,
                             confinement=confinement, oom_score_adj=oom_score_adj),
                    rootfs, _mounts(own_ipc=ipc_mode == pause.POD, shm_size_bytes=shm_size_bytes), namespaces,
                    cgroups_path, sysctls, seccomp=confinement.seccomp)
    if hostname and not host_network:
        doc["hostname"] = hostname
    doc["linux"]["resources"] = {"devices": pod_rules(privileged).to_oci()}
    return doc


def task_spec(*, sandbox_id: str, args: list[str], env: Mapping[str, str], cwd: str, rootfs: str, pause_pid: int,
              pid_mode: str, own_ipc: bool, cgroups_path: str | None = None,
              shm_size_bytes: int = pause.DEFAULT_SHM_SIZE_BYTES,
              confinement: Confinement = Confinement(), readonly: bool = True,  # noqa: B008 - a frozen Record
              mounts: tuple[TaskMount, ...] = (), masked_paths: tuple[str, ...] = MASKED_PATHS,
              readonly_paths: tuple[str, ...] = READONLY_PATHS, privileged: bool = False,
              shm_source: str | None = None, target_pid: int = 0,
              devices: tuple[HostDevice, ...] = (), device_rules: DeviceRules = DEFAULT_RULES,
              resources: Mapping[str, Any] | None = None, oom_score_adj: int | None = None,
              cgroup_namespace: bool = False, unified_cgroups: bool = False,
              hooks: tuple[Hook, ...] = ()) -> dict[str, Any]:
    """A task's config.json: ``args`` in the pause's network, ipc and uts namespaces (by path), its own
    mount namespace on ``rootfs`` (read-only with ``readonly``) with the standard mounts and then
    ``mounts``, and the pause's pid namespace (``pid_mode`` POD), the one of ``target_pid``
    (TARGET), the runtime's own (NODE: no pid namespace entry) or a new one (CONTAINER); its
    process confined as ``confinement`` says (user, capabilities, noNewPrivileges, ``linux.seccomp``
    as given). ``privileged``: no masked or read-only paths, /sys read-write; ``devices`` (for a
    privileged task, the host's) are made in its /dev; ``device_rules`` (its cgroup's, which the
    shim has applied already) are said in ``linux.resources.devices``, explicitly, as containerd
    writes them (runc adds its own defaults, crun none).
    ``shm_source``: the pod's /dev/shm, bound on the task's. ``resources`` (protocol.md 7.3) go to
    ``linux.resources`` as :data:`shim.kernel.cgroups.RESOURCE_FILES` says, ``oom_score_adj`` to
    ``process.oomScoreAdj``. ``cgroup_namespace`` (pure cgroup v2, as containerd asks there): a
    cgroup namespace of its own, which the cgroup mount on /sys/fs/cgroup shows from its cgroup.
    ``unified_cgroups`` (/sys/fs/cgroup is cgroup v2): ``resources``' ``unified`` map is said too.
    ``hooks``: its OCI hooks, which the runtime runs."""
    ns_dir = f"/proc/{pause_pid}/ns"
    namespaces = [_namespace("mount"), _namespace("network", f"{ns_dir}/net"), _namespace("ipc", f"{ns_dir}/ipc"),
                  _namespace("uts", f"{ns_dir}/uts")]
    if pid_mode != pause.NODE:
        pid_paths = {pause.POD: f"{ns_dir}/pid", "TARGET": f"/proc/{target_pid}/ns/pid"}
        namespaces.append(_namespace("pid", pid_paths.get(pid_mode)))
    cgroup_mounts = []
    if cgroup_namespace:
        namespaces.append(_namespace("cgroup"))
        cgroup_mounts.append({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                              "options": ["nosuid", "noexec", "nodev", "relatime", "rw" if privileged else "ro"]})
    doc = _document("container", sandbox_id,
                    _process(args, [f"{k}={v}" for k, v in env.items()], cwd, confinement=confinement,
                             oom_score_adj=oom_score_adj),
                    rootfs, _mounts(own_ipc=own_ipc, shm_size_bytes=shm_size_bytes, privileged=privileged,
                                    shm_source=shm_source)
                    + cgroup_mounts + [mount.to_oci() for mount in mounts], namespaces, cgroups_path, seccomp=confinement.seccomp,
                    readonly=readonly, masked_paths=() if privileged else masked_paths,
                    readonly_paths=() if privileged else readonly_paths)
    # As containerd: the root is rshared when a bind is (or what is mounted below the bind inside
    # would stop at the root's copy of the host's mounts and never reach the host), else rslave
    # (runc's own default, said for crun too, whose default is private): a bind's rslave
    # propagation needs a root that receives mounts.
    shared = any(mount.propagation in ("rshared", "shared") for mount in mounts)
    doc["linux"]["rootfsPropagation"] = "rshared" if shared else "rslave"
    if devices:
        doc["linux"]["devices"] = [device.to_oci() for device in devices]
    if hooks:
        doc["hooks"] = oci_hooks(hooks)
    # The shim writes every resource to the task's cgroup itself, for every handler, before the
    # runtime runs (crun's cgroup manager is disabled on a hybrid host); they are said again here
    # so that runc's own view of the container agrees. Hugepage limits are the shim's writes
    # only: runc fails a hugetlb limit where that hierarchy is not mounted. ``unified`` is said
    # where /sys/fs/cgroup is cgroup v2 (runc refuses it on v1): there, under the systemd driver,
    # the runtime makes the task's scope and says the files systemd owns as unit properties, which
    # a file write of the shim's could not hold against.
    said: dict[str, Any] = {"devices": device_rules.to_oci()}
    for key, value in (resources or {}).items():
        oci = RESOURCE_FILES.get(key, (None, None, None))[2]
        if oci is not None and value is not None:
            section, name = oci.split(".")
            said.setdefault(section, {})[name] = value
    unified = (resources or {}).get("unified")
    if unified and unified_cgroups:
        said["unified"] = dict(unified)
    doc["linux"]["resources"] = said
    return doc


def with_user_namespace(doc: dict[str, Any], userns: UserNamespace, *, sysfs_source: str,
                        pause_pid: int | None = None) -> dict[str, Any]:
    """``doc`` (a config.json of :func:`sandbox_spec` or :func:`task_spec`) in a pod's user namespace
    of ``userns``'s mappings: the pause's gets a new one, which the runtime makes first and the
    pod's other namespaces in it; a task's joins the pause's (``pause_pid``), with its mappings
    said too (runc wants them). A task leaves the network namespace out: it is CNI's, owned by the
    host's user namespace, and runc joins the user namespace first, after which it may no longer
    join that one; the runtime runs in it instead and the container keeps it (the backend starts
    it there). ``/sys``: a bind of ``sysfs_source`` (the host's sysfs, read-only), as a user
    namespace may not mount the sysfs of a network namespace it does not own."""
    linux_doc = doc["linux"]
    namespaces = [ns for ns in linux_doc["namespaces"] if pause_pid is None or ns["type"] != "network"]
    namespaces.append({"type": "user", "path": f"/proc/{pause_pid}/ns/user"} if pause_pid is not None
                      else {"type": "user"})
    linux_doc["namespaces"] = namespaces
    for key, maps in (("uidMappings", userns.uids), ("gidMappings", userns.gids)):
        linux_doc[key] = [{"containerID": m.container_id, "hostID": m.host_id, "size": m.length} for m in maps]
    for mount in doc["mounts"]:
        if mount["type"] == "sysfs":
            mount.update(type="bind", source=sysfs_source,
                         options=["rbind", *(o for o in mount["options"] if o not in ("ro", "rw")), "ro"])
    return doc
