"""OCI runtime backends: runc or crun run a sandbox's pause and its tasks instead of the shim's launcher.

CreateSandbox's ``options.runtime_handler`` chooses who starts the sandbox's processes: ``native`` is
:mod:`shim.runtime.process`; ``runc`` and ``crun`` are the runtime's command line, driven the way containerd's
runc shim drives it: ``create`` (the container's init then waits on the runtime's exec fifo), the shim
places the init in the sandbox cgroup and watches it, ``start``, and at the end ``delete --force``.

- **The pause rootfs** (:func:`ensure_pause_rootfs`): ``<runtime root>/pause-rootfs/`` holds
  ``/pause`` and empty ``/proc``, ``/dev`` and ``/sys`` mount points, built once (a temporary directory
  renamed into place, so concurrent shims never see half of it) and used read-only by every sandbox.
  ``/pause`` is a copy of ``/usr/bin/catatonit``, the same pause the native handler runs, in its
  pause mode (``-P``). It is used because Debian builds it **statically** (``file`` says "statically
  linked"): the rootfs holds no libc and no loader, so a dynamically linked pause could not even be
  exec'd there. The build refuses an ELF with an interpreter (PT_INTERP) with FAILED_PRECONDITION,
  as it refuses a missing catatonit.
- **Specs** (:func:`sandbox_spec`, :func:`task_spec`): pure functions that return config.json
  documents, after containerd's sandbox and container specs.
- **The runtime** (:class:`OciRuntime`): one CLI call per verb with ``--root``, run by
  :func:`shim.runtime.process.launch` (fork/exec in a new session, stdin /dev/null, reaped by the shim's one
  Reaper), bounded by a named timeout, its errors read from its JSON log (``<bundle>/log.json``, as
  containerd does) into a typed status whose sentence is the runtime's own.
- **The backend** (:class:`OciBackend`): what a sandbox with a runc/crun handler owns: the runtime,
  the bundles under ``<shim bundle>/oci/`` and the containers made there, each recorded in state.json
  (through ``persist``) *before* the runtime creates it, so ``podshim delete`` can delete it.

Choices, and why:

- **oom_score_adj.** The pause should get -998 (CRI). Lowering a process's oom_score_adj below the
  shim's needs CAP_SYS_RESOURCE, and an OCI runtime fails the whole create when its write is refused
  (runc: "failed to update /proc/self/oom_score_adj: Permission denied"). So the capability is
  checked up front (bit 24 of CapEff in /proc/self/status): without it and below the shim's own
  value, ``oomScoreAdj`` is left out of config.json, logged, and shown in the verbose status
  (``oci.oom_score_adj``). One create instead of a failed one and a retry; the native launcher
  likewise goes on without it.
- **crun on a hybrid cgroup machine.** crun 1.8 refuses to create anything while the v2 hierarchy of a
  hybrid layout has a controller ("cgroups in hybrid mode not supported") — and it checks before
  asking its cgroup manager, so ``--cgroup-manager=disabled`` alone is not enough. When the layout is
  hybrid (v1 controllers mounted and cgroup2 at /sys/fs/cgroup/unified) ``crun create`` runs in a
  mount namespace of its own where that controller list is /dev/null (the host's own hierarchies are
  never remounted), with ``--cgroup-manager=disabled``, and *inside the sandbox's cgroups*: the shim
  joins crun to them before exec, so crun's container is born there and every page it touches is
  charged there; between create and start the init is written into every cgroup.procs again.
  Trade-off: crun sets no cgroup limits or device rules (the shim gives pods none, but a container's
  device access is then bounded only by its capabilities), ``crun kill --all`` and ``delete`` cannot
  find processes through cgroups and leave the directories alone — the shim kills through its
  cgroups and removes them itself, which it does for every handler anyway.
- **runc's cgroups.** The shim makes the directories (:class:`~shim.kernel.cgroups.SandboxCgroup`, recorded
  before any process is in them) and gives runc ``cgroupsPath`` as the same path relative to runc's
  own cgroup in each hierarchy — the shim's, as runc is its child — so runc (cgroupfs driver) joins
  the very directories that metrics, kill and cleanup already know. runc's ``delete`` removes them,
  and the shim's removal then finds nothing left to do.
- **Task rootfs.** There are no images: a task's root is the host's ``/``, bound (not recursively,
  so no netns or other mounts come along) onto ``<task bundle>/rootfs`` inside a mount namespace made
  for the runtime's create only — the container's mount namespace is copied from it, and nothing is
  mounted in the host's, so nothing can leak there — and made read-only by ``root.readonly``.
  (runc refuses ``root.path: "/"``, and crun a bind mount onto ``/``.) A task's /dev/shm is a tmpfs
  of its own: containerd shares the pod's by mounting a tmpfs on the host and binding it into every
  container, which would be a host mount for the shim to own; SysV IPC is shared through the pod's
  IPC namespace all the same.
- **Exits.** The container's init is the shim's child once the runtime has exited (the shim is a
  child subreaper), so the shim's Reaper reports its exit as for native processes: the code, or
  128 + the signal. The shim signals processes by pidfd, as for native ones.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shim.kernel import cgroups, linux
from shim.runtime import pause, process
from shim.kernel.cgroups import SandboxCgroup
from shim.paths import write_json_atomic
from shim.kernel.reaper import ExitInfo, Reaper
from shim.rpc.files import decode_json, ensure_private_dir
from shim.rpc.status import (AlreadyExists, DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, NotFound,
                         RpcError)

__all__ = [
    "CREATE_TIMEOUT",
    "DELETE_TIMEOUT",
    "KILL_TIMEOUT",
    "OCI_DIR",
    "PAUSE_ROOTFS_DIR",
    "START_TIMEOUT",
    "STATE_TIMEOUT",
    "Container",
    "OciBackend",
    "OciRuntime",
    "cgroup_hybrid",
    "cgroups_path",
    "delete_recorded",
    "ensure_pause_rootfs",
    "oom_score_adj_permitted",
    "sandbox_spec",
    "task_spec",
]

log = logging.getLogger(__name__)

OCI_VERSION = "1.0.2"
OCI_DIR = "oci"  # <shim bundle>/oci: the pause's bundle; <shim bundle>/oci/tasks/<task id>: a task's
PAUSE_ROOTFS_DIR = "pause-rootfs"  # under the runtime root, shared by every sandbox
PAUSE_ARGS = ("/pause", "-P")  # catatonit's pause mode
PAUSE_NAME = "pause"  # the pause's command name once exec'd (/proc/PID/status Name)
#: Bounds on one runtime call, seconds. create includes the runtime forking its init into the
#: namespaces; delete --force includes killing and waiting for the container's processes.
CREATE_TIMEOUT = 10.0
START_TIMEOUT = 5.0
STATE_TIMEOUT = 5.0
KILL_TIMEOUT = 5.0
DELETE_TIMEOUT = 10.0

CAP_SYS_RESOURCE = 24
#: The cgroup v2 controller list crun reads to refuse a hybrid layout.
HYBRID_CONTROLLERS_FILE = "/sys/fs/cgroup/unified/cgroup.controllers"
_MAX_ERROR_MESSAGES = 5
_MAX_MESSAGE_CHARS = 500
_PT_INTERP = 3
_EXEC_FAILURE = re.compile(r"\bexec(?::|utable file)")
#: containerd's default capabilities for a container (Docker's list).
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
#: runc's default masked and read-only paths (`runc spec`).
MASKED_PATHS = (
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
)
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


# -- the pause rootfs ---------------------------------------------------------------------------


def ensure_pause_rootfs(runtime_root: str, source: str = pause.CATATONIT) -> str:
    """The shared pause rootfs under ``runtime_root``, built on first use; returns its path.

    Built in a temporary directory and renamed into place, so a concurrent shim sees all of it or
    none (the loser of a race drops its copy). Raises FailedPrecondition when ``source`` is missing
    or is not a static executable (the rootfs holds no libraries).
    """
    target = os.path.join(runtime_root, PAUSE_ROOTFS_DIR)
    if os.access(os.path.join(target, "pause"), os.X_OK):
        return target
    _check_static_executable(source)
    ensure_private_dir(runtime_root, 0o711, keep_mode=True)
    tmp = tempfile.mkdtemp(prefix=f".{PAUSE_ROOTFS_DIR}-", dir=runtime_root)
    try:
        os.chmod(tmp, 0o755)
        for mount_point in ("proc", "dev", "sys"):
            os.mkdir(os.path.join(tmp, mount_point), 0o755)
        shutil.copyfile(source, os.path.join(tmp, "pause"))
        os.chmod(os.path.join(tmp, "pause"), 0o755)
        try:
            os.rename(tmp, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone when the rename won
    return target


def _check_static_executable(path: str) -> None:
    """FailedPrecondition unless ``path`` is an executable ELF without a program interpreter."""
    what = f"the OCI pause needs catatonit at {path}, a static binary (apt-get install catatonit)"
    if not os.access(path, os.X_OK):
        raise FailedPrecondition(f"{what}: it is missing or not executable")
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] not in (1, 2) or header[5] not in (1, 2):
            raise FailedPrecondition(f"{what}: it is not an ELF executable")
        order = "<" if header[5] == 1 else ">"
        if header[4] == 2:  # 64-bit
            (phoff,) = struct.unpack_from(order + "Q", header, 32)
            phentsize, phnum = struct.unpack_from(order + "HH", header, 54)
        else:
            (phoff,) = struct.unpack_from(order + "I", header, 28)
            phentsize, phnum = struct.unpack_from(order + "HH", header, 42)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    for i in range(min(phnum, len(table) // max(phentsize, 1))):
        if struct.unpack_from(order + "I", table, i * phentsize)[0] == _PT_INTERP:
            raise FailedPrecondition(f"{what}: it is dynamically linked, and the pause rootfs holds no libraries")


# -- facts about this machine -------------------------------------------------------------------


def oom_score_adj_permitted(value: int, status_path: str = "/proc/self/status") -> bool:
    """Whether a child of this process may set its oom_score_adj to ``value``.

    Raising it is always allowed; lowering it below ours needs CAP_SYS_RESOURCE (bit 24 of CapEff).
    """
    try:
        with open("/proc/self/oom_score_adj") as f:
            if value >= int(f.read()):
                return True
        with open(status_path) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError):
        pass
    return False


def cgroup_hybrid() -> bool:
    """True on a hybrid cgroup layout: v1 controllers mounted, and cgroup2 at /sys/fs/cgroup/unified."""
    found = cgroups.discover_hierarchies()
    v1_controllers = any(h.key != cgroups.V2 and any(not c.startswith("name=") for c in h.controllers)
                         for h in found)
    unified = any(h.key == cgroups.V2 and h.mountpoint == os.path.dirname(HYBRID_CONTROLLERS_FILE) for h in found)
    return v1_controllers and unified


def cgroups_path(cgroup: SandboxCgroup) -> str | None:
    """The OCI ``cgroupsPath`` that names ``cgroup``'s directories for a runtime started by this process.

    Relative (to the runtime's own cgroup, which is ours) when the directories are below our cgroup in
    every hierarchy, else absolute when they are the same path from every hierarchy's root; None if
    neither (the runtime then uses its default and the init is moved into ``cgroup`` after create).
    """
    relative, absolute = set(), set()
    for hierarchy in cgroups.discover_hierarchies():
        directory = cgroup.paths.get(hierarchy.key)
        if directory is None:
            continue
        own, root = hierarchy.directory(hierarchy.own_path), hierarchy.directory("/")
        if own is not None:
            relative.add(os.path.relpath(directory, own))
        if root is not None:
            absolute.add("/" + os.path.relpath(directory, root))
    if len(relative) == 1 and not (path := relative.pop()).startswith(".."):
        return path
    if len(absolute) == 1:
        return absolute.pop()
    return None


# -- specs ----------------------------------------------------------------------------------------


def _namespace(kind: str, path: str | None = None) -> dict[str, str]:
    return {"type": kind, "path": path} if path else {"type": kind}


def _mounts(*, own_ipc: bool, shm_size_bytes: int) -> list[dict[str, Any]]:
    """proc, a /dev tmpfs with devpts, /dev/shm (a tmpfs of its own with an own IPC namespace, else
    the host's bound in, as containerd does), mqueue with an own IPC namespace, sysfs read-only."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
    ]
    if own_ipc:
        mounts.append({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                       "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={shm_size_bytes}"]})
        mounts.append({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                       "options": ["nosuid", "noexec", "nodev"]})
    else:
        mounts.append({"destination": "/dev/shm", "type": "bind", "source": "/dev/shm",
                       "options": ["rbind", "nosuid", "nodev", "noexec"]})
    mounts.append({"destination": "/sys", "type": "sysfs", "source": "sysfs",
                   "options": ["nosuid", "noexec", "nodev", "ro"]})
    return mounts


def _document(container_type: str, sandbox_id: str, process_doc: dict[str, Any], rootfs: str,
              mounts: list[dict[str, Any]], namespaces: list[dict[str, str]], cgroups_path: str | None,
              sysctls: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A config.json: a read-only root, runc's masked and read-only paths, CRI's annotations."""
    linux_doc: dict[str, Any] = {"namespaces": namespaces, "maskedPaths": list(MASKED_PATHS),
                                 "readonlyPaths": list(READONLY_PATHS)}
    if sysctls:
        linux_doc["sysctl"] = dict(sysctls)
    if cgroups_path:
        linux_doc["cgroupsPath"] = cgroups_path
    return {
        "ociVersion": OCI_VERSION,
        "process": process_doc,
        "root": {"path": rootfs, "readonly": True},
        "mounts": mounts,
        "annotations": {"io.kubernetes.cri.container-type": container_type,
                        "io.kubernetes.cri.sandbox-id": sandbox_id},
        "linux": linux_doc,
    }


def _process(args: list[str], env: list[str], cwd: str, *, no_new_privileges: bool,
             oom_score_adj: int | None) -> dict[str, Any]:
    caps = list(DEFAULT_CAPABILITIES)
    doc: dict[str, Any] = {
        "terminal": False,
        "user": {"uid": 0, "gid": 0},
        "args": list(args),
        "env": list(env),
        "cwd": cwd,
        "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
        "noNewPrivileges": no_new_privileges,
    }
    if oom_score_adj is not None:
        doc["oomScoreAdj"] = oom_score_adj
    return doc


def sandbox_spec(*, sandbox_id: str, rootfs: str, netns_path: str | None, pid_mode: str = pause.POD,
                 ipc_mode: str = pause.POD, hostname: str | None = None, sysctls: Mapping[str, str] | None = None,
                 cgroups_path: str | None = None, oom_score_adj: int | None = pause.DEFAULT_OOM_SCORE_ADJ,
                 shm_size_bytes: int = pause.DEFAULT_SHM_SIZE_BYTES) -> dict[str, Any]:
    """The pause container's config.json, as containerd's sandbox container spec.

    A read-only ``rootfs`` running ``/pause -P`` as root with no new privileges; new pid, ipc, uts
    and mount namespaces, joined to the network namespace ``netns_path``. NODE modes drop the
    namespace: host network (``netns_path`` None) drops network *and* uts (then ``hostname`` is
    ignored), NODE pid and ipc drop theirs (and /dev/shm is the host's). ``oom_score_adj`` None
    leaves the runtime's own. Raises InvalidArgument for an unknown mode or a sysctl that is not
    namespaced for this sandbox.
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
    doc = _document("sandbox", sandbox_id,
                    _process(list(PAUSE_ARGS), [f"PATH={process.DEFAULT_PATH}"], "/", no_new_privileges=True,
                             oom_score_adj=oom_score_adj),
                    rootfs, _mounts(own_ipc=ipc_mode == pause.POD, shm_size_bytes=shm_size_bytes), namespaces,
                    cgroups_path, sysctls)
    if hostname and not host_network:
        doc["hostname"] = hostname
    return doc


def task_spec(*, sandbox_id: str, args: list[str], env: Mapping[str, str], cwd: str, rootfs: str, pause_pid: int,
              pid_mode: str, own_ipc: bool, cgroups_path: str | None = None,
              shm_size_bytes: int = pause.DEFAULT_SHM_SIZE_BYTES) -> dict[str, Any]:
    """A task's config.json: ``args`` in the pause's network, ipc and uts namespaces (by path), its own
    mount namespace on a read-only ``rootfs``, and the pause's pid namespace (``pid_mode`` POD) or a
    new one (CONTAINER)."""
    ns_dir = f"/proc/{pause_pid}/ns"
    namespaces = [_namespace("mount"), _namespace("network", f"{ns_dir}/net"), _namespace("ipc", f"{ns_dir}/ipc"),
                  _namespace("uts", f"{ns_dir}/uts"),
                  _namespace("pid", f"{ns_dir}/pid" if pid_mode == pause.POD else None)]
    return _document("container", sandbox_id,
                     _process(args, [f"{k}={v}" for k, v in env.items()], cwd, no_new_privileges=False,
                              oom_score_adj=None),
                     rootfs, _mounts(own_ipc=own_ipc, shm_size_bytes=shm_size_bytes), namespaces, cgroups_path)


# -- the runtime -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Container:
    """One container of a runtime: its id in the runtime's root and its bundle directory."""

    container_id: str
    bundle: str

    @property
    def log_path(self) -> str:
        """The runtime's JSON log for this container's calls (containerd's ``log.json``)."""
        return os.path.join(self.bundle, "log.json")

    @property
    def pid_file(self) -> str:
        return os.path.join(self.bundle, "init.pid")


class OciRuntime:
    """An OCI runtime's command line (``runc`` or ``crun``) over one state directory ``root``.

    The coroutines need ``reaper`` (the shim's); :meth:`delete_now` is for processes without one
    (``podshim delete``). Every call is bounded by its timeout (DeadlineExceeded, after the runtime
    was killed). A runtime that fails raises NotFound ("does not exist"), AlreadyExists,
    FailedPrecondition (create: the program cannot be executed; or the binary is missing) or
    Internal, with the runtime's logged errors in the sentence.
    """

    def __init__(self, name: str, binary: str, root: str, *, reaper: Reaper | None = None,
                 cgroup_manager_disabled: bool = False):
        self.name = name
        self.binary = binary
        self.root = root
        self.reaper = reaper
        #: crun on a hybrid machine (see the module's docstring): the caller places the init.
        self.cgroup_manager_disabled = cgroup_manager_disabled

    @classmethod
    def find(cls, name: str, root: str, *, reaper: Reaper | None = None) -> OciRuntime:
        """The runtime ``name`` ("runc" or "crun") from PATH (and the usual sbin directories).

        Raises FailedPrecondition when it is not installed.
        """
        search = os.pathsep.join(filter(None, (os.environ.get("PATH"), process.DEFAULT_PATH)))
        binary = shutil.which(name, path=search)
        if binary is None:
            raise FailedPrecondition(f"runtime handler {name}: no {name} binary in {search} (install {name})")
        return cls(name, binary, root, reaper=reaper, cgroup_manager_disabled=name == "crun" and cgroup_hybrid())

    @property
    def manages_cgroups(self) -> bool:
        return not self.cgroup_manager_disabled

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "binary": self.binary, "root": self.root,
                "cgroup_manager_disabled": self.cgroup_manager_disabled}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> OciRuntime:
        """Rebuild from :meth:`to_dict`'s record (InvalidArgument when malformed)."""
        try:
            name, binary, root = str(record["name"]), str(record["binary"]), str(record["root"])
        except (KeyError, TypeError) as exc:
            raise InvalidArgument(f"malformed OCI runtime record: {exc!r}") from None
        if name not in ("runc", "crun") or not os.path.isabs(binary) or not os.path.isabs(root):
            raise InvalidArgument(f"malformed OCI runtime record: {dict(record)!r}")
        return cls(name, binary, root, cgroup_manager_disabled=bool(record.get("cgroup_manager_disabled")))

    def argv(self, container: Container, verb: str, *args: str) -> list[str]:
        """The command line of one call about ``container``."""
        if self.name == "crun":
            options = [f"--root={self.root}", f"--log=file:{container.log_path}", "--log-format=json"]
            if self.cgroup_manager_disabled:
                options.append("--cgroup-manager=disabled")
        else:
            options = ["--root", self.root, "--log", container.log_path, "--log-format", "json"]
        return [self.binary, *options, verb, *args]

    async def create(self, container: Container, *, stdout: int | None = None, stderr: int | None = None,
                     binds: tuple[tuple[str, str], ...] = (), procs_files: tuple[str, ...] = ()) -> int:
        """``create --bundle B --pid-file P ID``; returns the init's pid (the container waits for start).

        ``stdout``/``stderr`` become the container's (None: /dev/null): never a pipe the caller reads
        to its end, the container keeps it. ``binds`` are made for this call in a mount namespace of
        its own (the container's is copied from it); ``procs_files`` are joined before exec.
        """
        if self.cgroup_manager_disabled and os.path.exists(HYBRID_CONTROLLERS_FILE):
            binds = (("/dev/null", HYBRID_CONTROLLERS_FILE), *binds)
        try:
            os.unlink(container.pid_file)
        except FileNotFoundError:
            pass
        await self._run(container, "create", "--bundle", container.bundle, "--pid-file", container.pid_file,
                        container.container_id, timeout=CREATE_TIMEOUT, stdout=stdout, stderr=stderr, binds=binds,
                        procs_files=procs_files)
        try:
            with open(container.pid_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError) as exc:
            raise Internal(f"{self.name} create {container.container_id} succeeded but left no pid in "
                           f"{container.pid_file}: {exc}") from None

    async def start(self, container: Container) -> None:
        """``start ID``: the init execs the container's program."""
        await self._run(container, "start", container.container_id, timeout=START_TIMEOUT)

    async def state(self, container: Container) -> dict[str, Any]:
        """``state ID`` as a map (``status``: created, running, stopped, ...)."""
        output = await self._run(container, "state", container.container_id, timeout=STATE_TIMEOUT, capture=True)
        try:
            doc = decode_json(output, f"{self.name} state")
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise Internal(f"{self.name} state {container.container_id} printed no JSON map: {output[:200]!r}")
        return doc

    async def kill(self, container: Container, sig: int, *, all_processes: bool = False) -> None:
        """``kill [--all] ID SIG``."""
        extra = ("--all",) if all_processes else ()
        await self._run(container, "kill", *extra, container.container_id, str(int(sig)), timeout=KILL_TIMEOUT)

    async def delete(self, container: Container, *, force: bool = False) -> None:
        """``delete [--force] ID``; deleting a container the runtime does not know succeeds."""
        try:
            await self._run(container, "delete", *(("--force",) if force else ()), container.container_id,
                            timeout=DELETE_TIMEOUT)
        except NotFound:
            pass

    def delete_now(self, container: Container) -> None:
        """``delete --force ID``, blocking: for ``podshim delete``, which has no event loop or reaper."""
        argv = self.argv(container, "delete", "--force", container.container_id)
        offset = _file_size(container.log_path)
        what = f"{self.name} delete {container.container_id}"
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  timeout=DELETE_TIMEOUT, env={"PATH": process.DEFAULT_PATH}, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise DeadlineExceeded(f"{what} did not finish within {DELETE_TIMEOUT:g} s") from None
        except OSError as exc:
            raise FailedPrecondition(f"cannot run {self.binary}: {exc.strerror}") from None
        if done.returncode != 0:
            messages = _logged_errors(container.log_path, offset) or [done.stderr.decode(errors="replace").strip()]
            error = _failure(what, "delete", done.returncode, messages)
            if not isinstance(error, NotFound):
                raise error

    async def _run(self, container: Container, verb: str, *args: str, timeout: float, stdout: int | None = None,
                   stderr: int | None = None, capture: bool = False, binds: tuple[tuple[str, str], ...] = (),
                   procs_files: tuple[str, ...] = ()) -> bytes:
        """One call: launch, wait for the exit within ``timeout``, return stdout when ``capture``."""
        if self.reaper is None:
            raise FailedPrecondition(f"{self.name} {verb}: no reaper to wait for the runtime")
        what = f"{self.name} {verb} {container.container_id}"
        deadline = time.monotonic() + timeout
        offset = _file_size(container.log_path)
        read_fd = write_fd = None
        if capture:
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
            stdout = write_fd
        try:
            spec = process.ProcessSpec(
                name=f"{self.name} {verb}", argv=tuple(self.argv(container, verb, *args)),
                env={"PATH": process.DEFAULT_PATH}, unshare_flags=linux.CLONE_NEWNS if binds else 0, binds=binds,
                procs_files=procs_files, stdout=stdout, stderr=stderr)
            try:
                proc = await process.launch(spec, self.reaper)
            except process.ExecFailed as exc:
                raise FailedPrecondition(f"cannot run {self.binary}: {os.strerror(exc.errno)}") from None
            finally:
                if write_fd is not None:
                    os.close(write_fd)  # the runtime holds the only write end now: EOF when it exits
            info = await _wait_exit(proc, deadline, f"{what} did not finish within {timeout:g} s; it was killed")
            output = _read_to_end(read_fd) if read_fd is not None else b""
        finally:
            if read_fd is not None:
                os.close(read_fd)
        if info.exit_status != 0:
            raise _failure(what, verb, info.exit_status, _logged_errors(container.log_path, offset))
        return output


async def _wait_exit(proc: process.Process, deadline: float, late: str) -> ExitInfo:
    """The runtime's exit; past ``deadline`` (DeadlineExceeded: ``late``) or when cancelled, it is
    killed first."""
    try:
        return await asyncio.wait_for(asyncio.shield(proc.exit), max(0.0, deadline - time.monotonic()))
    except BaseException as exc:
        # Until the reaper has reaped it the pid is still the runtime's, so the kill is safe.
        if not proc.exit.done():
            process.signal_process(proc.pid, proc.start_time, signal.SIGKILL)
        if isinstance(exc, asyncio.TimeoutError):
            await asyncio.wait([proc.exit], timeout=process.CLEANUP_TIMEOUT)
            raise DeadlineExceeded(late) from None
        raise


def _read_to_end(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:  # something the runtime started still holds the pipe: take what is there
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _logged_errors(path: str, offset: int) -> list[str]:
    """The error messages the runtime logged to ``path`` after ``offset`` (JSON lines; text kept as is)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read(64 * 1024).decode("utf-8", "replace")
    except OSError:
        return []
    messages = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            entry = decode_json(line, path)
        except ValueError:
            entry = None
        if isinstance(entry, dict):
            if entry.get("level") in ("error", "fatal", "panic") and entry.get("msg"):
                messages.append(str(entry["msg"]))
        else:
            messages.append(line)
    return [m[:_MAX_MESSAGE_CHARS] for m in messages[-_MAX_ERROR_MESSAGES:]]


def _failure(what: str, verb: str, exit_status: int, messages: list[str]) -> RpcError:
    """The typed status of a failed runtime call, with the runtime's words."""
    text = "; ".join(m for m in messages if m) or f"it exited with status {exit_status} and logged nothing"
    sentence = f"{what} failed: {text}"
    lowered = text.lower()
    # runc: 'exec: "/x": stat /x: no such file or directory'; crun: "executable file `/x` not found"
    # (not runc's "nsexec[...]", which is its own setup failing).
    if verb == "create" and _EXEC_FAILURE.search(lowered):
        return FailedPrecondition(sentence)  # the container's program cannot be run
    # runc: "container does not exist"; crun: "error opening file `<root>/<id>/status`: No such file..."
    if "does not exist" in lowered or "not found" in lowered or (verb != "create" and "no such file" in lowered):
        return NotFound(sentence)
    if "already exists" in lowered:
        return AlreadyExists(sentence)
    return Internal(sentence)


# -- the backend of one sandbox -------------------------------------------------------------------------


class OciBackend:
    """The runtime and the containers of one sandbox with a runc/crun handler.

    Bundles live in ``<shim bundle>/oci/`` (the pause) and ``<shim bundle>/oci/tasks/<task id>/``;
    the pause's container id is the sandbox id, a task's ``<sandbox id>+<task id>`` (identifiers
    have no ``+``). The runtime's state is in ``<runtime root>/<handler>/<namespace>`` (containerd's
    layout). ``persist`` is called whenever the containers change: :meth:`record` goes to state.json.
    """

    def __init__(self, runtime: OciRuntime, *, sandbox_id: str, bundle: str, runtime_root: str,
                 persist: Callable[[], None]):
        self.runtime = runtime
        self.sandbox_id = sandbox_id
        self.bundle = os.path.join(bundle, OCI_DIR)
        self.runtime_root = runtime_root
        self.persist = persist
        self.containers: dict[str, Container] = {}
        self.oom_score_adj_note = ""

    @classmethod
    def open(cls, handler: str, *, namespace: str, sandbox_id: str, bundle: str, runtime_root: str, reaper: Reaper,
             persist: Callable[[], None]) -> OciBackend:
        """The backend of ``handler``; FailedPrecondition now (at CreateSandbox, before anything is made)
        when the runtime or catatonit is missing."""
        runtime = OciRuntime.find(handler, os.path.join(runtime_root, handler, namespace), reaper=reaper)
        ensure_pause_rootfs(runtime_root)
        return cls(runtime, sandbox_id=sandbox_id, bundle=bundle, runtime_root=runtime_root, persist=persist)

    @property
    def pause_container(self) -> Container:
        return Container(self.sandbox_id, self.bundle)

    def task_container(self, task_id: str) -> Container:
        return Container(f"{self.sandbox_id}+{task_id}", os.path.join(self.bundle, "tasks", task_id))

    def record(self) -> dict[str, Any]:
        """For state.json: the runtime and every container that may exist, tasks last."""
        return {"runtime": self.runtime.to_dict(),
                "containers": [{"id": c.container_id, "bundle": c.bundle} for c in self.containers.values()]}

    def info(self) -> dict[str, str]:
        """Verbose status lines."""
        return {"oci.runtime": self.runtime.name, "oci.binary": self.runtime.binary, "oci.root": self.runtime.root,
                "oci.bundle": self.bundle, "oci.container_id": self.sandbox_id,
                "oci.cgroup_manager": "disabled (the shim places the container)" if self.runtime.cgroup_manager_disabled
                else "cgroupfs", "oci.oom_score_adj": self.oom_score_adj_note}

    async def start_pause(self, spec: pause.PauseSpec) -> pause.PauseProcess:
        """Create and start the pause container as ``spec`` says (``pause_binary`` aside: it is the
        rootfs's catatonit); return once it is ready for signals. On failure the container is deleted."""
        if spec.cgroup is None:
            raise InvalidArgument("an OCI pause needs the sandbox cgroup")
        rootfs = ensure_pause_rootfs(self.runtime_root)
        oom = spec.oom_score_adj
        if oom is not None and not oom_score_adj_permitted(oom):
            self.oom_score_adj_note = f"{oom} not set: lowering it needs CAP_SYS_RESOURCE, which the shim lacks"
            log.warning("sandbox %s: oom_score_adj %s", self.sandbox_id, self.oom_score_adj_note)
            oom = None
        else:
            self.oom_score_adj_note = str(oom) if oom is not None else "the runtime's default"
        doc = sandbox_spec(sandbox_id=self.sandbox_id, rootfs=rootfs, netns_path=spec.netns_path,
                           pid_mode=spec.pid_mode, ipc_mode=spec.ipc_mode, hostname=spec.hostname,
                           sysctls=spec.sysctls, cgroups_path=self._cgroups_path(spec.cgroup), oom_score_adj=oom,
                           shm_size_bytes=spec.shm_size_bytes)
        container = self.pause_container
        pid, start_time, exit_future = await self._launch(container, doc, spec.cgroup, binds=())
        try:
            await pause.wait_ready(pid, exit_future, PAUSE_NAME)
        except BaseException:
            await asyncio.shield(self._delete(container))
            raise
        return pause.PauseProcess(pid, start_time, time.time_ns(), os.path.join(rootfs, "pause"), exit_future)

    async def start_task(self, task_id: str, *, args: list[str], env: Mapping[str, str], cwd: str, pid_mode: str,
                         pause_pid: int, own_ipc: bool, cgroup: SandboxCgroup, stdout: int, stderr: int
                         ) -> process.Process:
        """Create and start a task's container in the pause's namespaces, with ``stdout``/``stderr``
        (the CRI log pipes) as its own; return once the runtime started it. On failure the container
        is deleted; a program that cannot be run is FailedPrecondition."""
        container = self.task_container(task_id)
        rootfs = os.path.join(container.bundle, "rootfs")
        ensure_private_dir(rootfs, 0o755)
        doc = task_spec(sandbox_id=self.sandbox_id, args=args, env=env, cwd=cwd, rootfs=rootfs, pause_pid=pause_pid,
                        pid_mode=pid_mode, own_ipc=own_ipc,
                        cgroups_path=self._cgroups_path(cgroup))
        pid, start_time, exit_future = await self._launch(container, doc, cgroup, stdout=stdout, stderr=stderr,
                                                          binds=(("/", rootfs),))
        return process.Process(pid, start_time, time.time_ns(), exit_future)

    async def delete_task(self, task_id: str) -> None:
        """Delete a task's container (forced: a running one is killed) and its bundle. Idempotent."""
        container = self.containers.get(self.task_container(task_id).container_id)
        if container is not None:
            await self._delete(container, raise_errors=True)

    async def release(self) -> None:
        """Delete every container (tasks first, then the pause). Each is tried; the first error is
        raised at the end, and what could not be deleted stays recorded for ``podshim delete``."""
        errors = []
        for container in reversed(list(self.containers.values())):
            try:
                await self._delete(container, raise_errors=True)
            except RpcError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _cgroups_path(self, cgroup: SandboxCgroup) -> str | None:
        return cgroups_path(cgroup) if self.runtime.manages_cgroups else None

    async def _launch(self, container: Container, doc: dict[str, Any], cgroup: SandboxCgroup, *,
                      stdout: int | None = None, stderr: int | None = None,
                      binds: tuple[tuple[str, str], ...]) -> tuple[int, int, asyncio.Future[ExitInfo]]:
        """Write config.json, record the container, create it, place and watch its init, start it."""
        ensure_private_dir(container.bundle, 0o700)
        write_json_atomic(os.path.join(container.bundle, "config.json"), doc, durable=False)
        self.containers[container.container_id] = container
        self.persist()  # recorded before it exists: `podshim delete` deletes it after a crash
        try:
            # Without a cgroup manager, the runtime itself runs in the cgroup, so its init is born there.
            procs = () if self.runtime.manages_cgroups else tuple(cgroup.procs_files())
            pid = await self.runtime.create(container, stdout=stdout, stderr=stderr, binds=binds, procs_files=procs)
            assert self.runtime.reaper is not None
            exit_future = self.runtime.reaper.watch(pid)
            _check_our_child(pid, exit_future, f"{self.runtime.name} container {container.container_id}")
            # For runc a no-op (it joined these very directories); for crun the placement itself.
            cgroup.join(pid)
            # Not reaped yet (it waits for start, and only the reaper reaps it): the start time is its.
            start_time = linux.proc_start_time(pid) or 0
            await self.runtime.start(container)
        except BaseException:
            await asyncio.shield(self._delete(container))
            raise
        return pid, start_time, exit_future

    async def _delete(self, container: Container, *, raise_errors: bool = False) -> None:
        try:
            await self.runtime.delete(container, force=True)
        except RpcError as exc:
            if raise_errors:
                raise
            log.error("cannot delete %s container %s: %s", self.runtime.name, container.container_id, exc.message)
            return
        self.containers.pop(container.container_id, None)
        self.persist()
        if container.bundle != self.bundle:
            _remove_task_bundle(container.bundle)


def _check_our_child(pid: int, exit_future: asyncio.Future[ExitInfo], what: str) -> None:
    """Internal unless ``pid`` is the shim's child, whose exit its Reaper will see."""
    if exit_future.done():
        raise Internal(f"the init of {what} (pid {pid}) exited before it was started")
    stat = linux.proc_stat(pid)
    parent = int(stat[linux.STAT_PPID - 1]) if stat is not None else 0
    if parent != os.getpid():
        raise Internal(f"the init of {what} (pid {pid}) is not a child of the shim (its parent is {parent}): "
                       "its exit could not be seen")


def _remove_task_bundle(bundle: str) -> None:
    """Remove a task's bundle file by file, never recursively: its rootfs is only a mount point
    here, and if something were mounted on it, rmdir fails instead of deleting the host's files."""
    for name in ("config.json", "log.json", "init.pid"):
        try:
            os.unlink(os.path.join(bundle, name))
        except FileNotFoundError:
            pass
    for directory in (os.path.join(bundle, "rootfs"), bundle):
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove %s: %s", directory, exc.strerror)


def delete_recorded(record: Mapping[str, Any]) -> list[str]:
    """``podshim delete``'s part: delete --force every container of an ``oci`` state.json record
    (tasks first), blocking. Returns the ids it could not delete (after logging why)."""
    runtime = OciRuntime.from_dict(record.get("runtime") or {})
    left = []
    for entry in reversed(list(record.get("containers") or [])):
        container = Container(str(entry["id"]), str(entry["bundle"]))
        try:
            runtime.delete_now(container)
        except RpcError as exc:
            log.error("cannot delete %s container %s: %s", runtime.name, container.container_id, exc.message)
            left.append(container.container_id)
    return left
