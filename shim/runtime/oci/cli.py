"""An OCI runtime's command line (runc or crun): one call per verb, each bounded by a named timeout.

A call is launched by :func:`shim.runtime.process.launch` (fork/exec in a new session, stdin
/dev/null, reaped by the shim's one Reaper) and killed when it outlives its timeout. Its errors
are read from its JSON log (``<bundle>/log.json``, as containerd does) into a typed status whose
sentence is the runtime's own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shim.kernel import linux, seccomp
from shim.kernel.reaper import ExitInfo, Reaper
from shim.lib.files import decode_json
from shim.rpc.status import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    RpcError,
)
from shim.runtime import process
from shim.runtime.oci.host import HYBRID_CONTROLLERS_FILE, cgroup_hybrid

__all__ = ["CREATE_TIMEOUT", "DELETE_TIMEOUT", "EXEC_TIMEOUT", "KILL_TIMEOUT", "START_TIMEOUT", "STATE_TIMEOUT",
           "Container", "OciCli"]

#: Bounds on one runtime call, seconds. create includes the runtime forking its init into the
#: namespaces; delete --force includes killing and waiting for the container's processes.
CREATE_TIMEOUT = 10.0
START_TIMEOUT = 5.0
STATE_TIMEOUT = 5.0
KILL_TIMEOUT = 5.0
DELETE_TIMEOUT = 10.0
#: exec --detach: the runtime joins the container and starts the process, then exits.
EXEC_TIMEOUT = 10.0

_MAX_ERROR_MESSAGES = 5
_MAX_MESSAGE_CHARS = 500
_MAX_LOG_READ_BYTES = 64 * 1024  # of the runtime's log, from where the call began
_EXEC_FAILURE = re.compile(r"\bexec(?::|utable file)")
_HOOK_FAILURE = re.compile(r"\berror (?:running|executing) hook\b|\btimeout expired for `")


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


#: ``OciCli.seccomp_flags`` by runtime binary.
_SECCOMP_FLAGS: dict[str, frozenset[str]] = {}

class OciCli:
    """An OCI runtime's command line (``runc`` or ``crun``) over one state directory ``root``.

    The coroutines need ``reaper`` (the shim's); :meth:`delete_now` is for processes without one
    (``podshim delete``). Every call is bounded by its timeout (DeadlineExceeded, after the runtime
    was killed). A runtime that fails raises NotFound ("does not exist"), AlreadyExists,
    FailedPrecondition (create: the program cannot be executed; or the binary is missing) or
    Internal, with the runtime's logged errors in the sentence.
    """

    def __init__(self, name: str, binary: str, root: str, *, reaper: Reaper | None = None,
                 cgroup_manager_disabled: bool = False, systemd_cgroup: bool = False):
        self.name = name
        self.binary = binary
        self.root = root
        self.reaper = reaper
        #: crun on a hybrid machine (see :mod:`shim.runtime.oci`): the caller places the init.
        self.cgroup_manager_disabled = cgroup_manager_disabled
        #: The systemd cgroup driver: the runtime's own systemd driver starts each container's scope
        #: (runc ``--systemd-cgroup``, crun ``--cgroup-manager=systemd``; cgroupsPath ``slice:prefix:name``).
        self.systemd_cgroup = systemd_cgroup

    @classmethod
    def find(cls, name: str, root: str, *, reaper: Reaper | None = None, systemd_cgroup: bool = False) -> OciCli:
        """The runtime ``name`` ("runc" or "crun") from PATH (and the usual sbin directories), with
        its systemd cgroup driver when ``systemd_cgroup``.

        Raises FailedPrecondition when it is not installed.
        """
        search = os.pathsep.join(filter(None, (os.environ.get("PATH"), process.DEFAULT_PATH)))
        binary = shutil.which(name, path=search)
        if binary is None:
            raise FailedPrecondition(f"runtime handler {name}: no {name} binary in {search} (install {name})")
        return cls(name, binary, root, reaper=reaper, systemd_cgroup=systemd_cgroup,
                   cgroup_manager_disabled=name == "crun" and not systemd_cgroup and cgroup_hybrid())

    def seccomp_flags(self) -> frozenset[str]:
        """The seccomp filter flags this runtime applies: ``<runtime> features``'
        linux.seccomp.supportedFlags (runc 1.2+); runc 1.1 lists none and refuses every flag
        ("seccomp flags are not yet supported by runc"); crun, which has no ``features``, takes them.
        Asked once per binary and shim (a few ms, only for a profile that has flags)."""
        flags = _SECCOMP_FLAGS.get(self.binary)
        if flags is None:
            try:
                done = subprocess.run([self.binary, "features"], capture_output=True, text=True, timeout=10)
                features = json.loads(done.stdout) if done.returncode == 0 else None
            except (OSError, ValueError, subprocess.TimeoutExpired):
                features = None
            if not isinstance(features, dict):
                flags = frozenset(seccomp.FLAGS)
            else:
                listed = ((features.get("linux") or {}).get("seccomp") or {}).get("supportedFlags") or []
                flags = frozenset(flag for flag in listed if isinstance(flag, str))
            _SECCOMP_FLAGS[self.binary] = flags
        return flags

    @property
    def manages_cgroups(self) -> bool:
        return not self.cgroup_manager_disabled

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "binary": self.binary, "root": self.root,
                "cgroup_manager_disabled": self.cgroup_manager_disabled, "systemd_cgroup": self.systemd_cgroup}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> OciCli:
        """Rebuild from :meth:`to_dict`'s record (InvalidArgument when malformed)."""
        try:
            name, binary, root = str(record["name"]), str(record["binary"]), str(record["root"])
        except (KeyError, TypeError) as exc:
            raise InvalidArgument(f"malformed OCI runtime record: {exc!r}") from None
        if name not in ("runc", "crun") or not os.path.isabs(binary) or not os.path.isabs(root):
            raise InvalidArgument(f"malformed OCI runtime record: {dict(record)!r}")
        return cls(name, binary, root, cgroup_manager_disabled=bool(record.get("cgroup_manager_disabled")),
                   systemd_cgroup=bool(record.get("systemd_cgroup")))

    def argv(self, container: Container, verb: str, *args: str) -> list[str]:
        """The command line of one call about ``container``."""
        if self.name == "crun":
            options = [f"--root={self.root}", f"--log=file:{container.log_path}", "--log-format=json"]
            if self.cgroup_manager_disabled:
                options.append("--cgroup-manager=disabled")
            elif self.systemd_cgroup:
                options.append("--cgroup-manager=systemd")
        else:
            options = ["--root", self.root, "--log", container.log_path, "--log-format", "json"]
            if self.systemd_cgroup:
                options.append("--systemd-cgroup")
        return [self.binary, *options, verb, *args]

    async def create(self, container: Container, *, stdout: int | None = None, stderr: int | None = None,
                     stdin: int | None = None,
                     binds: tuple[tuple[str, str], ...] = (), binds_from: tuple[tuple[str, str, str], ...] = (),
                     attach: tuple[tuple[int, str], ...] = (), join: tuple[tuple[str, int], ...] = (),
                     sysctls: Mapping[str, str] | None = None, procs_files: tuple[str, ...] = (),
                     console_socket: str = "") -> int:
        """``create --bundle B --pid-file P ID``; returns the init's pid (the container waits for start).

        ``stdout``/``stderr`` become the container's (None: /dev/null): never a pipe the caller reads
        to its end, the container keeps it. ``binds``, ``binds_from`` and ``attach`` (see
        :class:`~shim.runtime.process.ProcessSpec`) are made for this call in a mount namespace of
        its own (the container's is copied from it); ``join`` (namespaces the runtime runs in) and
        ``procs_files`` are joined before exec, and ``sysctls`` written there. With
        ``console_socket`` (a process with ``terminal``), the runtime sends its terminal's master there.
        """
        if self.cgroup_manager_disabled and os.path.exists(HYBRID_CONTROLLERS_FILE):
            binds = (("/dev/null", HYBRID_CONTROLLERS_FILE), *binds)
        try:
            os.unlink(container.pid_file)
        except FileNotFoundError:
            pass
        console_args, cwd = _console(console_socket)
        await self._run(container, "create", "--bundle", container.bundle, "--pid-file", container.pid_file,
                        *console_args, container.container_id, timeout=CREATE_TIMEOUT, cwd=cwd, stdout=stdout,
                        stderr=stderr, binds=binds, binds_from=binds_from, attach=attach, join=join,
                        sysctls=sysctls, procs_files=procs_files, stdin=stdin)
        try:
            with open(container.pid_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError) as exc:
            raise Internal(f"{self.name} create {container.container_id} succeeded but left no pid in "
                           f"{container.pid_file}: {exc}") from None

    async def exec(self, container: Container, process_file: str, pid_file: str, *, stdout: int | None,
                   stderr: int | None, stdin: int | None = None, procs_files: tuple[str, ...] = (),
                   join: tuple[tuple[str, int], ...] = (), console_socket: str = "") -> int:
        """``exec --detach --pid-file P --process F ID``: the process ``process_file`` describes, in
        the container, with ``stdin``/``stdout``/``stderr`` as its own; returns its pid once the runtime has
        exited (the process is then an orphan its nearest subreaper, the shim, adopts).
        ``join`` (namespaces the runtime runs in) and ``procs_files`` are joined before the runtime runs (without a cgroup manager, that is where
        the process is born). With ``console_socket`` (a process with ``terminal``), the runtime sends
        its terminal's master there."""
        try:
            os.unlink(pid_file)
        except FileNotFoundError:
            pass
        console_args, cwd = _console(console_socket)
        await self._run(container, "exec", "--detach", "--pid-file", pid_file, "--process", process_file,
                        *console_args, container.container_id, timeout=EXEC_TIMEOUT, cwd=cwd, stdout=stdout,
                        stderr=stderr, stdin=stdin, procs_files=procs_files, join=join)
        try:
            with open(pid_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError) as exc:
            raise Internal(f"{self.name} exec in {container.container_id} succeeded but left no pid in "
                           f"{pid_file}: {exc}") from None

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
                   binds_from: tuple[tuple[str, str, str], ...] = (), attach: tuple[tuple[int, str], ...] = (),
                   join: tuple[tuple[str, int], ...] = (), sysctls: Mapping[str, str] | None = None,
                   procs_files: tuple[str, ...] = (), stdin: int | None = None, cwd: str = "/") -> bytes:
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
                env={"PATH": process.DEFAULT_PATH}, cwd=cwd,
                unshare_flags=linux.CLONE_NEWNS if binds or binds_from or attach else 0, binds=binds,
                binds_from=binds_from, attach=attach, join=join, sysctls=dict(sysctls or {}),
                procs_files=procs_files, stdout=stdout,
                stderr=stderr, stdin=stdin)
            try:
                proc = await process.launch(spec, self.reaper)
            except process.ExecFailed as exc:
                raise FailedPrecondition(f"cannot run {self.binary}: {os.strerror(exc.errno)}") from None
            finally:
                if write_fd is not None:
                    os.close(write_fd)  # the runtime holds the only write end now: EOF when it exits
            info = await _wait_exit(proc, deadline, f"{what} did not finish within {timeout:g} s; it was killed")
            output = process.read_available(read_fd) if read_fd is not None else b""
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
        return await process.wait_exit(proc, deadline)
    except TimeoutError:
        raise DeadlineExceeded(late) from None


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
            text = f.read(_MAX_LOG_READ_BYTES).decode("utf-8", "replace")
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
    if verb in ("create", "exec") and _EXEC_FAILURE.search(lowered):
        return FailedPrecondition(sentence)  # the container's (or the exec's) program cannot be run
    # runc: "error running hook #0: ..."; crun: "error executing hook `/x` (exit code: 3)", "timeout
    # expired for `/x`": the container's OCI hooks (its CDI devices') are the client's to fix, as its
    # program is.
    if verb in ("create", "start") and _HOOK_FAILURE.search(lowered):
        return FailedPrecondition(sentence)
    # runc: "container does not exist"; crun: "error opening file `<root>/<id>/status`: No such file..."
    if "does not exist" in lowered or "not found" in lowered or (verb != "create" and "no such file" in lowered):
        return NotFound(sentence)
    if "already exists" in lowered:
        return AlreadyExists(sentence)
    return Internal(sentence)


def _console(console_socket: str) -> tuple[tuple[str, ...], str]:
    """The runtime's arguments for ``console_socket`` ("" for none) and the working directory to run
    it in: ``--console-socket`` by its name in that directory, the socket's own (runc and crun also
    chdir to the bundle, where a task's is), since a socket's path may be longer than sun_path allows;
    "/" without one."""
    if not console_socket:
        return (), "/"
    return ("--console-socket", os.path.basename(console_socket)), os.path.dirname(console_socket)
