"""The ``runc`` and ``crun`` runtime handlers: a :class:`~shim.runtime.base.Runtime` over an OCI
runtime's command line (see :mod:`shim.runtime.oci` for how and why)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from shim.kernel import linux
from shim.kernel.cgroups import SandboxCgroup
from shim.kernel.cgroups.hierarchies import discover_hierarchies, pure_v2
from shim.kernel.linux import oom_score_adj_permitted
from shim.kernel.reaper import ExitInfo, Reaper
from shim.lib.console import CONSOLE_TIMEOUT, Console
from shim.lib.files import ensure_private_dir, read_json, write_json_atomic
from shim.lib.idmaps import IdMap, UserNamespace
from shim.rpc.status import FailedPrecondition, Internal, InvalidArgument, RpcError
from shim.runtime import pause, process
from shim.runtime.base import ExecSpec, Runtime, TaskSpec
from shim.runtime.confine import Confinement, oci_rlimits
from shim.runtime.mounts import BindMount, host_devices
from shim.runtime.oci.cli import CREATE_TIMEOUT, Container, OciCli
from shim.runtime.oci.host import cgroup_unified, cgroups_path, systemd_cgroups_path
from shim.runtime.oci.rootfs import PAUSE_FILE, ensure_pause_rootfs
from shim.runtime.oci.spec import PAUSE_ARGS, PAUSE_NAME, sandbox_spec, task_spec, with_user_namespace
from shim.runtime.oci.userns import PreparedMounts, check_reachable, open_bundle

__all__ = ["OCI_DIR", "OciBackend", "delete_recorded"]

log = logging.getLogger(__name__)

OCI_DIR = "oci"  # <shim bundle>/oci: the pause's bundle; <shim bundle>/oci/tasks/<task id>: a task's
_BUNDLE_MODE = 0o700
_TASK_ROOTFS_MODE = 0o755
_CONSOLE_SOCKET = "console.sock"  # <task bundle>/console.sock: where the runtime sends a terminal task's master
_TASK_BUNDLE_FILES = ("config.json", "log.json", "init.pid", _CONSOLE_SOCKET)  # (the socket: after a crash)
_COMM_BYTES = 15  # a command name (/proc/PID/status Name) is the program's file name, cut to this
_TASK_SHM_DIR = "shm"  # <task bundle>/shm: where the pod's /dev/shm is bound for the create


class OciBackend(Runtime):
    """The runtime and the containers of one sandbox with a runc/crun handler.

    Bundles live in ``<shim bundle>/oci/`` (the pause) and ``<shim bundle>/oci/tasks/<task id>/``;
    the pause's container id is the sandbox id, a task's ``<sandbox id>+<task id>`` (identifiers
    have no ``+``). The runtime's state is in ``<runtime root>/<handler>/<namespace>`` (containerd's
    layout). ``persist`` is called whenever the containers change: :meth:`record` goes to state.json.
    """

    def __init__(self, cli: OciCli, *, sandbox_id: str, bundle: str, runtime_root: str,
                 persist: Callable[[], None]):
        self.cli = cli
        self.sandbox_id = sandbox_id
        self.bundle = os.path.join(bundle, OCI_DIR)
        self.runtime_root = runtime_root
        self.persist = persist
        self.containers: dict[str, Container] = {}
        self.oom_score_adj_note = ""

    @classmethod
    def open(cls, handler: str, *, namespace: str, sandbox_id: str, bundle: str, runtime_root: str, reaper: Reaper,
             persist: Callable[[], None], image_pause: bool = False, systemd_cgroup: bool = False) -> OciBackend:
        """The backend of ``handler`` (with the runtime's systemd cgroup driver when ``systemd_cgroup``);
        FailedPrecondition now (at CreateSandbox, before anything is made) when the runtime or (unless
        the pause is a sandbox image's, ``image_pause``) catatonit is missing."""
        cli = OciCli.find(handler, os.path.join(runtime_root, handler, namespace), reaper=reaper,
                          systemd_cgroup=systemd_cgroup)
        if not image_pause:
            ensure_pause_rootfs(runtime_root)
        return cls(cli, sandbox_id=sandbox_id, bundle=bundle, runtime_root=runtime_root, persist=persist)

    @property
    def starts_units(self) -> bool:
        return self.cli.systemd_cgroup

    @property
    def attaches_device_programs(self) -> bool:
        return self.cli.manages_cgroups and cgroup_unified()

    @property
    def pause_container(self) -> Container:
        return Container(self.sandbox_id, self.bundle)

    def task_container(self, task_id: str) -> Container:
        return Container(f"{self.sandbox_id}+{task_id}", os.path.join(self.bundle, "tasks", task_id))

    def record(self) -> dict[str, Any]:
        """For state.json: the runtime and every container that may exist, tasks last."""
        return {"runtime": self.cli.to_dict(),
                "containers": [{"id": c.container_id, "bundle": c.bundle} for c in self.containers.values()]}

    def info(self) -> dict[str, str]:
        return {"oci.runtime": self.cli.name, "oci.binary": self.cli.binary, "oci.root": self.cli.root,
                "oci.bundle": self.bundle, "oci.container_id": self.sandbox_id,
                "oci.cgroup_manager": "disabled (the shim places the container)" if self.cli.cgroup_manager_disabled
                else "systemd" if self.cli.systemd_cgroup else "cgroupfs", "oci.oom_score_adj": self.oom_score_adj_note}

    async def start_pause(self, spec: pause.PauseSpec) -> pause.PauseProcess:
        """Create and start the pause container as ``spec`` says (``pause_binary`` aside: it is the
        shared rootfs's catatonit, or a sandbox image's ``spec.args`` on ``spec.rootfs``); return once
        it is ready for signals. On failure the container is deleted."""
        pause.check_user_namespace(spec)
        if spec.cgroup is None:
            raise InvalidArgument("an OCI pause needs the sandbox cgroup")
        if spec.rootfs is not None:  # a sandbox image's program
            rootfs, args, env, cwd, binary = spec.rootfs, spec.args, spec.env, spec.cwd, spec.args[0]
            # Its exec is seen by the program's inode, else by its command name (a script's is).
            name = os.path.basename(args[0])[:_COMM_BYTES]
            exe = pause.program_identity(rootfs, args, spec.env_map)
            sigterm_grace: float | None = pause.IMAGE_SIGTERM_GRACE
        else:  # catatonit, from the shared pause rootfs
            rootfs, args, env, cwd = ensure_pause_rootfs(self.runtime_root), PAUSE_ARGS, (), "/"
            binary = os.path.join(rootfs, PAUSE_FILE)
            name, exe, sigterm_grace = PAUSE_NAME, None, None
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
                           shm_size_bytes=spec.shm_size_bytes, confinement=spec.confinement, args=args,
                           env=env, cwd=cwd, privileged=spec.privileged)
        container = self.pause_container
        if spec.userns is None:
            pid, start_time, exit_future = await self._launch(container, doc, spec.cgroup)
        else:
            # The runtime makes the user namespace and the pod's others in it. Its root may not
            # write the sysctls of CNI's network namespace, owned by the host's user namespace:
            # the runtime's launcher writes them there first.
            net_sysctls = {key: value for key, value in doc["linux"].get("sysctl", {}).items()
                           if key.startswith("net.")}
            for key in net_sysctls:
                del doc["linux"]["sysctl"][key]
            shim_bundle = os.path.dirname(self.bundle)
            open_bundle(shim_bundle, spec.userns)
            prepared = PreparedMounts.for_pause(shim_bundle, rootfs)
            try:
                check_reachable(prepared.root, spec.userns)
                doc["root"]["path"] = prepared.root
                doc = with_user_namespace(doc, spec.userns, sysfs_source=prepared.sysfs)
                assert spec.netns_path is not None  # check_user_namespace: the pod's own network
                pid, start_time, exit_future = await self._launch(
                    container, doc, spec.cgroup, attach=tuple(prepared.attach), sysctls=net_sysctls,
                    join=((spec.netns_path, linux.CLONE_NEWNET),) if net_sysctls else ())
            finally:
                prepared.close()
        try:
            await pause.wait_ready(pid, exit_future, name, exe=exe, sigterm_grace=sigterm_grace)
        except BaseException:
            await asyncio.shield(self._delete(container))
            raise
        return pause.PauseProcess(pid, start_time, time.time_ns(), binary, exit_future)

    async def start_task(self, spec: TaskSpec) -> process.Process:
        """Create and start a task's container in the pause's namespaces, with ``stdout``/``stderr``
        (the CRI log pipes) as its own; return once the runtime started it. On failure the container
        is deleted; a program that cannot be run is FailedPrecondition."""
        container = self.task_container(spec.task_id)
        try:
            userns = UserNamespace.of_process(spec.pause_pid)
        except OSError:
            raise FailedPrecondition(f"the pod's pause ({spec.pause_pid}) is gone") from None
        if userns is not None:
            if spec.devices:  # as the native handler: no device node is made in a pod's user namespace
                raise FailedPrecondition(f"task {spec.task_id}'s devices cannot be made in the pod's user namespace")
            open_bundle(os.path.dirname(self.bundle), userns)
            check_reachable(spec.rootfs, userns)
            prepared = self._prepare_task(spec)
            try:
                return await self._start_task(container, spec, userns, prepared)
            finally:
                prepared.close()
        return await self._start_task(container, spec)

    def _prepare_task(self, spec: TaskSpec) -> PreparedMounts:
        try:
            idmap = IdMap.of_process(spec.pause_pid)
        except OSError:
            idmap = None
        if idmap is None:
            raise FailedPrecondition(f"the pod's pause ({spec.pause_pid}) is gone")
        try:
            return PreparedMounts.for_task(os.path.dirname(self.bundle), spec.task_id, spec.filesystem, spec.rootfs,
                                           idmap)
        finally:
            idmap.close()

    async def _start_task(self, container: Container, spec: TaskSpec, userns: UserNamespace | None = None,
                          prepared: PreparedMounts | None = None) -> process.Process:
        """:meth:`start_task`, in the pod's user namespace ``userns`` (its mounts ``prepared``) when given."""
        fs = spec.filesystem
        binds = fs.mounts if prepared is None else tuple(
            BindMount(mount.destination, source, mount.options) for mount, source in zip(fs.mounts, prepared.sources, strict=False))
        # The pod's /dev/shm: the pause's, taken from its mount namespace for the create only.
        shm = os.path.join(container.bundle, _TASK_SHM_DIR)
        ensure_private_dir(shm, _TASK_ROOTFS_MODE)
        unified = pure_v2(discover_hierarchies())
        doc = task_spec(sandbox_id=self.sandbox_id, args=list(spec.args), env=spec.env, cwd=spec.cwd,
                        rootfs=spec.rootfs,  # mounted there by the shim at Create
                        pause_pid=spec.pause_pid, pid_mode=spec.pid_mode, own_ipc=spec.own_ipc,
                        cgroups_path=self._cgroups_path(spec.cgroup), confinement=spec.confinement,
                        readonly=fs.readonly_rootfs, mounts=binds, masked_paths=fs.masked_paths,
                        readonly_paths=fs.readonly_paths, privileged=fs.privileged, shm_source=shm,
                        devices=(*(host_devices() if fs.privileged else ()), *spec.devices),
                        device_rules=spec.device_rules, target_pid=spec.target_pid, resources=spec.resources,
                        oom_score_adj=spec.oom_score_adj, cgroup_namespace=unified, unified_cgroups=unified,
                        hooks=spec.hooks)
        join: tuple[tuple[str, int], ...] = ()
        if userns is not None and prepared is not None:
            doc = with_user_namespace(doc, userns, sysfs_source=prepared.sysfs, pause_pid=spec.pause_pid)
            join = ((f"/proc/{spec.pause_pid}/ns/net", linux.CLONE_NEWNET),)  # see with_user_namespace
        if spec.console is not None:
            # The runtime makes the terminal in the container and sends its master to our socket.
            doc["process"]["terminal"] = True
            spec.console.listen(os.path.join(container.bundle, _CONSOLE_SOCKET))
        # The runtime runs in a mount namespace of its own, a recursive slave of the shim's: the
        # source of a bidirectional (rshared) bind is bound there again, over itself, as a copy
        # taken in the shim's namespace, a peer of the host's mount (containerd runs the runtime in
        # the host's namespace), so what the task mounts below it reaches the host. (A privileged
        # task's, as bidirectional binds are: never in a pod's user namespace.)
        peers = tuple(("/proc/self/ns/mnt", mount.source, mount.source) for mount in binds
                      if mount.propagation in ("rshared", "shared"))
        pid, start_time, exit_future = await self._launch(
            container, doc, spec.cgroup, stdout=spec.stdout, stderr=spec.stderr, stdin=spec.stdin,
            binds_from=((f"/proc/{spec.pause_pid}/ns/mnt", "/dev/shm", shm), *peers), console=spec.console,
            attach=tuple(prepared.attach) if prepared is not None else (), join=join)
        return process.Process(pid, start_time, process.started_at_ns(exit_future), exit_future)

    def check_confinement(self, confinement: Confinement) -> None:
        flags = (confinement.seccomp or {}).get("flags") or []
        unsupported = [flag for flag in flags if flag not in self.cli.seccomp_flags()]
        if unsupported:
            raise InvalidArgument(f"field 'seccomp': {self.cli.name} does not support the filter flag "
                                  f"{unsupported[0]} (this handler cannot apply it)")

    async def exec_process(self, spec: ExecSpec) -> process.Process:
        """``<runtime> exec --detach`` into the task's container: the task's OCI process settings
        (user, capabilities, environment, working directory) with ``spec.args``, as containerd
        builds an exec's process. The process is the shim's child once the runtime has exited, and
        reaped like the task's. A program that cannot be run is FailedPrecondition, in the
        runtime's words."""
        if spec.terminal:
            raise FailedPrecondition(f"an exec on a terminal of the client's is not supported with {self.cli.name}, "
                                     "which makes the terminal itself: give console_socket instead")
        nofile = next((limit for limit in spec.confinement.rlimits if limit.type == "RLIMIT_NOFILE"), None)
        if self.cli.name == "runc" and nofile is not None and nofile.soft < nofile.hard:
            # runc sets an exec's limits from outside while the exec's runc init, a Go program,
            # raises its own RLIMIT_NOFILE soft limit to the hard one: either may come last.
            raise FailedPrecondition(f"an exec's RLIMIT_NOFILE soft limit {nofile.soft} below its hard limit "
                                     f"{nofile.hard} is not applied reliably by runc (it may become {nofile.hard}): "
                                     "use the crun or native handler, or equal limits")
        container = self.containers.get(self.task_container(spec.task_id).container_id)
        if container is None:
            raise FailedPrecondition(f"task {spec.task_id} has no {self.cli.name} container")
        try:
            task_process = read_json(os.path.join(container.bundle, "config.json"))["process"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise Internal(f"cannot read the process of {self.cli.name} container {container.container_id}: "
                           f"{exc}") from None
        # Removed when the exec has started or failed, so the bundle is as the task left it.
        files = os.path.join(container.bundle, f"exec-{spec.exec_id}")
        exec_process = {**task_process, "args": list(spec.args), "terminal": bool(spec.console_socket),
                        "rlimits": oci_rlimits(spec.confinement)}  # the task's, or the exec's own
        if spec.console_socket:
            exec_process["consoleSize"] = {"width": spec.console_size[0], "height": spec.console_size[1]}
        write_json_atomic(files + ".json", exec_process, durable=False)
        try:
            # Without a cgroup manager, the runtime runs in the task's cgroup: the process is born there.
            procs = () if self.cli.manages_cgroups else tuple(spec.cgroup.procs_files())
            try:
                pid = await self.cli.exec(container, files + ".json", files + ".pid", stdout=spec.stdout,
                                          stderr=spec.stderr, stdin=spec.stdin, procs_files=procs,
                                          join=_network_of(spec.task_pid), console_socket=spec.console_socket)
            except RpcError as exc:
                # The runtime names the socket it could not connect to (by its name in its directory).
                if spec.console_socket and os.path.basename(spec.console_socket) in exc.message:
                    raise InvalidArgument(f"field 'console_socket' ({spec.console_socket}): {exc.message}") from None
                raise
        finally:
            for path in (files + ".json", files + ".pid"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        assert self.cli.reaper is not None
        exit_future = self.cli.reaper.watch(pid)  # an exit already reaped is kept: never lost
        if exit_future.done():
            return process.Process(pid, 0, time.time_ns(), exit_future)
        _check_parent(pid, f"exec {spec.exec_id} in task {spec.task_id}")
        # Not reaped yet (only the reaper reaps it, in a loop callback): the start time is its.
        return process.Process(pid, linux.proc_start_time(pid) or 0, time.time_ns(), exit_future)

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
        if self.cli.systemd_cgroup:
            return systemd_cgroups_path(cgroup)
        return cgroups_path(cgroup) if self.cli.manages_cgroups else None

    async def _launch(self, container: Container, doc: dict[str, Any], cgroup: SandboxCgroup, *,
                      stdout: int | None = None, stderr: int | None = None, stdin: int | None = None,
                      binds_from: tuple[tuple[str, str, str], ...] = (), attach: tuple[tuple[int, str], ...] = (),
                      join: tuple[tuple[str, int], ...] = (), sysctls: Mapping[str, str] | None = None,
                      console: Console | None = None) -> tuple[int, int, asyncio.Future[ExitInfo]]:
        """Write config.json, record the container, create it (its launcher with ``binds_from``,
        ``attach``, ``join`` and ``sysctls``, see :class:`~shim.runtime.process.ProcessSpec`), place
        and watch its init, start it. With ``console`` (listening), the terminal's master the
        runtime sends there is received before the start."""
        ensure_private_dir(container.bundle, _BUNDLE_MODE)
        write_json_atomic(os.path.join(container.bundle, "config.json"), doc, durable=False)
        self.containers[container.container_id] = container
        self.persist()  # recorded before it exists: `podshim delete` deletes it after a crash
        try:
            # Without a cgroup manager, the runtime itself runs in the cgroup, so its init is born there.
            procs = () if self.cli.manages_cgroups else tuple(cgroup.procs_files())
            # The runtime connects and sends the master during create: accepted as it comes.
            receiving = asyncio.ensure_future(console.receive(CREATE_TIMEOUT)) if console is not None else None
            try:
                pid = await self.cli.create(container, stdout=stdout, stderr=stderr, stdin=stdin,
                                            binds_from=binds_from, attach=attach, join=join, sysctls=sysctls,
                                            procs_files=procs,
                                            console_socket=console.path if console is not None else "")
                if receiving is not None:
                    try:
                        await asyncio.wait_for(asyncio.shield(receiving), CONSOLE_TIMEOUT)
                    except (OSError, TimeoutError) as exc:
                        reason = exc.strerror if isinstance(exc, OSError) else "it sent none in time"
                        raise Internal(f"{self.cli.name} create {container.container_id}: no terminal on the console "
                                       f"socket: {reason}") from None
            finally:
                if receiving is not None and not receiving.done():
                    receiving.cancel()
                    await asyncio.gather(receiving, return_exceptions=True)
            assert self.cli.reaper is not None
            exit_future = self.cli.reaper.watch(pid)
            _check_our_child(pid, exit_future, f"{self.cli.name} container {container.container_id}")
            if self.cli.systemd_cgroup:
                # The runtime placed it in the scope it started: crun in a sub-cgroup of it.
                cgroup.follow(pid)
            else:
                # For runc a no-op (it joined these very directories); for crun the placement itself.
                cgroup.join(pid)
            # Not reaped yet (it waits for start, and only the reaper reaps it): the start time is its.
            start_time = linux.proc_start_time(pid) or 0
            await self.cli.start(container)
        except BaseException:
            await asyncio.shield(self._delete(container))
            raise
        return pid, start_time, exit_future

    async def _delete(self, container: Container, *, raise_errors: bool = False) -> None:
        try:
            await self.cli.delete(container, force=True)
        except RpcError as exc:
            if raise_errors:
                raise
            log.error("cannot delete %s container %s: %s", self.cli.name, container.container_id, exc.message)
            return
        self.containers.pop(container.container_id, None)
        self.persist()
        if container.bundle != self.bundle:
            _remove_task_bundle(container.bundle)


def _network_of(pid: int) -> tuple[tuple[str, int], ...]:
    """Where an exec into task ``pid`` runs its runtime: the task's network namespace when the task
    is in a pod's user namespace (its config leaves the network out, see
    :func:`~shim.runtime.oci.spec.with_user_namespace`, and the runtime's exec would stay in the
    host's), none otherwise."""
    try:
        own = UserNamespace.of_process(pid) is not None
    except OSError:
        return ()  # gone: the runtime's exec says so
    return ((f"/proc/{pid}/ns/net", linux.CLONE_NEWNET),) if own else ()


def _check_our_child(pid: int, exit_future: asyncio.Future[ExitInfo], what: str) -> None:
    """Internal unless ``pid``, the init of container ``what``, is waiting to start as the shim's child."""
    if exit_future.done():
        raise Internal(f"the init of {what} (pid {pid}) exited before it was started")
    _check_parent(pid, f"the init of {what}")


def _check_parent(pid: int, what: str) -> None:
    """Internal unless ``pid`` (``what``) is the shim's child, whose exit its Reaper will see."""
    stat = linux.proc_stat(pid)
    parent = int(stat[linux.STAT_PPID - 1]) if stat is not None else 0
    if parent != os.getpid():
        raise Internal(f"{what} (pid {pid}) is not a child of the shim (its parent is {parent}): "
                       "its exit could not be seen")


def _remove_task_bundle(bundle: str) -> None:
    """Remove a task's bundle file by file, never recursively: its rootfs is only a mount point
    here, and if something were mounted on it, rmdir fails instead of deleting the host's files."""
    for name in _TASK_BUNDLE_FILES:
        try:
            os.unlink(os.path.join(bundle, name))
        except FileNotFoundError:
            pass
    for directory in (os.path.join(bundle, "rootfs"), os.path.join(bundle, _TASK_SHM_DIR), bundle):
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove %s: %s", directory, exc.strerror)


def delete_recorded(record: Mapping[str, Any]) -> dict[str, Any]:
    """``podshim delete``'s part: delete --force every container of an ``oci`` state.json record
    (tasks first), blocking. Returns the record of what is left: the containers it could not
    delete (after logging why). Raises InvalidArgument for a malformed record."""
    cli = OciCli.from_dict(record.get("runtime") or {})
    entries = record.get("containers") or []
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) and "id" in e and "bundle" in e
                                                  for e in entries):
        raise InvalidArgument(f"malformed OCI container list: {entries!r}")
    left: list[dict[str, Any]] = []
    for entry in reversed(entries):
        container = Container(str(entry["id"]), str(entry["bundle"]))
        try:
            cli.delete_now(container)
        except RpcError as exc:
            log.error("cannot delete %s container %s: %s", cli.name, container.container_id, exc.message)
            left.insert(0, dict(entry))
    return {**record, "containers": left}
