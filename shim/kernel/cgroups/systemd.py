"""The systemd cgroup driver: a sandbox's cgroup as a transient scope that systemd makes.

Under this driver a sandbox's parent is a slice named as kubelet names them
(``kubepods-burstable-pod<uid>.slice``, which systemd expands to
``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice``), and the sandbox's
cgroup is the scope ``podshim-<namespace>-<sandbox id>.scope`` in it, made over systemd's D-Bus API
(org.freedesktop.systemd1.Manager.StartTransientUnit) with ``Delegate=yes``: systemd owns the
scope and its resources as unit properties (:func:`unit_properties`), and what is below it (the
pause's leaf, each task's cgroup) is the shim's, written as files (systemd's delegation contract).

A scope is made with the processes it starts with; the pause does not exist yet when its cgroup
is made, so a placeholder child of the shim (:class:`Placeholder`) is the scope's first process
until the pause is in. The placeholder dies with the shim (its parent-death signal), and a scope
whose processes are all gone is stopped by systemd: a shim killed at any step leaves no scope
behind; one that outlives its shim (the pause running) is stopped by ``podshim delete``
(:meth:`Manager.stop_unit`), which the record names.

The bus is spoken with jeepney under the caller's event loop (:class:`Manager`: jeepney's message
core and its asyncio router, one connection per process and loop, opened at the first need, after
any fork): a unit's job is awaited, never waited for with the loop blocked. A caller with no loop
(``podshim delete``) runs the call on a loop of its own (:func:`stop_unit_blocking`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from typing import Any

from shim.kernel import linux
from shim.kernel.cgroups.resources import cpu_weight
from shim.rpc.status import FailedPrecondition, InvalidArgument

__all__ = ["DEFAULT_SLICE", "SCOPE_PREFIX", "START_TIMEOUT", "Manager", "Placeholder", "close_manager", "escape",
           "manager", "pod_slice_name",
           "runtime_cgroups_path", "scope_name", "slice_properties", "stop_unit_blocking", "unified_properties",
           "unit_properties"]

log = logging.getLogger(__name__)

#: The parent slice of a sandbox given none under the systemd driver.
DEFAULT_SLICE = "podshim.slice"
#: The first part of the name of every unit podshim starts.
SCOPE_PREFIX = "podshim"
START_TIMEOUT = 30.0  # seconds systemd may take to start or stop a unit (a job)

_INFINITY = (1 << 64) - 1  # systemd's "infinity" for a uint64 property
_SYSTEMD = ("org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager")


def _job_removed_rule() -> Any:
    from jeepney import MatchRule

    # No sender in the rule: the bus delivers it from systemd's unique name (":1.1"), which the
    # router's own filter would not match against the well-known one.
    return MatchRule(type="signal", interface=_SYSTEMD[2], member="JobRemoved", path=_SYSTEMD[1])


def escape(text: str) -> str:
    """``text`` as one part of a unit name, as ``systemd-escape`` writes it: letters, digits,
    ``:``, ``_`` and ``.`` (not leading) kept, every other byte ``\\xNN``; so a ``-`` of ours
    never reads as a slice's nesting."""
    out = []
    for i, byte in enumerate(text.encode()):
        char = chr(byte)
        if (char.isascii() and char.isalnum()) or char in ":_" or (char == "." and i > 0):
            out.append(char)
        else:
            out.append(f"\\x{byte:02x}")
    return "".join(out)


def scope_name(namespace: str, sandbox_id: str, task_id: str | None = None) -> str:
    """The unit name of a sandbox's pause's scope (``podshim-<namespace>-<sandbox id>.scope``), or
    of its task ``task_id``'s (``podshim-<namespace>-<sandbox id>-<task id>.scope``): unique among
    every shim's (a namespace's sandbox ids are, and a sandbox's task ids), each part escaped so
    that its ``-`` are the separators."""
    tail = "" if task_id is None else f"-{escape(task_id)}"
    return f"{SCOPE_PREFIX}-{escape(namespace)}-{escape(sandbox_id)}{tail}.scope"


def pod_slice_name(parent_slice: str, namespace: str, sandbox_id: str) -> str:
    """The unit name of a sandbox's own slice in ``parent_slice`` (kubelet's pod slice, or
    :data:`DEFAULT_SLICE`): ``<parent>-podshim_<namespace>_<sandbox id>.slice``, the parts escaped
    (``_`` too, so that the two ``_`` are the separators)."""
    def part(text: str) -> str:
        return escape(text).replace("_", "\\x5f")

    stem = "" if parent_slice == "-.slice" else parent_slice[:-len(".slice")] + "-"
    return f"{stem}{SCOPE_PREFIX}_{part(namespace)}_{part(sandbox_id)}.slice"


def runtime_cgroups_path(slice_name: str, scope: str) -> str:
    """The OCI ``cgroupsPath`` that makes an OCI runtime's systemd driver (runc ``--systemd-cgroup``,
    crun ``--cgroup-manager=systemd``) start the scope ``scope`` (one of :func:`scope_name`'s) in
    ``slice_name``: ``slice:prefix:name``, the unit being ``prefix-name.scope``, as containerd passes it."""
    prefix, namespace, name = scope[:-len(".scope")].split("-", 2)
    return f"{slice_name}:{prefix}-{namespace}:{name}"


def unit_properties(resources: Mapping[str, Any]) -> list[tuple[str, tuple[str, Any]]]:
    """The systemd unit properties of the resources (Update's keys, already checked) that systemd
    owns on a unit: CPUWeight, CPUQuotaPerSecUSec and CPUQuotaPeriodUSec, MemoryMax,
    MemorySwapMax, TasksMax, AllowedCPUs, AllowedMemoryNodes; the others stay file writes. The
    quota is rounded up to 10 ms a second, as systemd keeps it (and runc rounds it)."""
    props: list[tuple[str, tuple[str, Any]]] = []
    shares = resources.get("cpu_shares")
    if shares is not None:
        props.append(("CPUWeight", ("t", cpu_weight(shares))))
    quota, period = resources.get("cpu_quota_us"), resources.get("cpu_period_us")
    if period is not None:
        props.append(("CPUQuotaPeriodUSec", ("t", period)))
    if quota is not None:
        if quota == -1:
            props.append(("CPUQuotaPerSecUSec", ("t", _INFINITY)))
        else:
            per_sec = quota * 1_000_000 // (period or 100_000)
            per_sec = -(-per_sec // 10_000) * 10_000
            props.append(("CPUQuotaPerSecUSec", ("t", per_sec)))
    memory, swap = resources.get("memory_limit_bytes"), resources.get("memory_swap_limit_bytes")
    if memory is not None:
        props.append(("MemoryMax", ("t", _INFINITY if memory == -1 else memory)))
    if swap is not None and (swap == -1 or (memory is not None and memory != -1)):
        props.append(("MemorySwapMax", ("t", _INFINITY if swap == -1 else swap - memory)))
    pids = resources.get("pids_limit")
    if pids is not None:
        props.append(("TasksMax", ("t", _INFINITY if pids == -1 else pids)))
    for key, name in (("cpuset_cpus", "AllowedCPUs"), ("cpuset_mems", "AllowedMemoryNodes")):
        if resources.get(key) is not None:
            props.append((name, ("ay", _bitmask(resources[key]))))
    owned, _ = unified_properties(resources.get("unified") or {})
    if owned:
        # A file of CRI's ``unified`` map that systemd owns as a property: systemd writes the
        # property's value over the file whenever it applies the unit, so it is said as the
        # property (runc's systemd driver does the same); it comes after, and wins over, a field.
        named = {name for name, _ in owned}
        props = [prop for prop in props if prop[0] not in named] + owned
    return props


#: The cgroup v2 files of CRI's ``unified`` map that systemd writes from a unit property, and the
#: property: a plain file write there would be undone when systemd next applies the unit.
UNIFIED_PROPERTIES = {"pids.max": "TasksMax", "memory.max": "MemoryMax", "memory.high": "MemoryHigh",
                      "memory.low": "MemoryLow", "memory.min": "MemoryMin", "memory.swap.max": "MemorySwapMax",
                      "cpu.weight": "CPUWeight", "cpu.max": "CPUQuotaPerSecUSec", "cpuset.cpus": "AllowedCPUs",
                      "cpuset.mems": "AllowedMemoryNodes", "io.weight": "IOWeight"}


def unified_properties(unified: Mapping[str, Any]) -> tuple[list[tuple[str, tuple[str, Any]]], list[str]]:
    """The unit properties of the files of a ``unified`` map that systemd owns
    (:data:`UNIFIED_PROPERTIES`), and the names of the others (plain file writes). InvalidArgument
    for a value the file would not take."""
    props: list[tuple[str, tuple[str, Any]]] = []
    others: list[str] = []
    for name, value in sorted(unified.items()):
        if name not in UNIFIED_PROPERTIES:
            others.append(name)
            continue
        words = str(value).split()
        try:
            if name == "cpu.max":
                if not 1 <= len(words) <= 2:
                    raise ValueError(value)
                quota, period_us = words[0], int(words[1]) if len(words) == 2 else 100_000
                if period_us <= 0:
                    raise ValueError(value)
                props.append(("CPUQuotaPeriodUSec", ("t", period_us)))
                per_sec = _INFINITY if quota == "max" else -(-(int(quota) * 1_000_000 // period_us) // 10_000) * 10_000
                props.append(("CPUQuotaPerSecUSec", ("t", per_sec)))
            elif name in ("cpuset.cpus", "cpuset.mems"):
                props.append((UNIFIED_PROPERTIES[name], ("ay", _bitmask(str(value).strip()))))
            else:
                if name == "io.weight" and len(words) == 2 and words[0] == "default":
                    words = words[1:]
                if len(words) != 1:
                    raise ValueError(value)
                number = _INFINITY if words[0] == "max" and name not in ("cpu.weight", "io.weight") else int(words[0])
                if number < 0:
                    raise ValueError(value)
                props.append((UNIFIED_PROPERTIES[name], ("t", number)))
        except ValueError:
            raise InvalidArgument(f"resources.unified[{name}]: {value!r} is not a value the file takes (systemd "
                                  f"owns it as {UNIFIED_PROPERTIES[name]}, which needs one)") from None
    return props, others


#: The resources (Update's keys) a slice's properties say (:func:`unit_properties`).
_PROPERTY_KEYS = ("cpu_shares", "cpu_quota_us", "cpu_period_us", "memory_limit_bytes", "memory_swap_limit_bytes",
                  "pids_limit", "cpuset_cpus", "cpuset_mems")


def slice_properties(resources: Mapping[str, Any]) -> list[tuple[str, tuple[str, Any]]]:
    """:func:`unit_properties` for a pod's slice, whose files are systemd's alone: InvalidArgument
    naming a resource systemd has no property for (huge pages, a ``unified`` file not in
    :data:`UNIFIED_PROPERTIES`), and a memory+swap
    limit without the memory limit it is counted from."""
    for key, value in resources.items():
        if value is None:
            continue
        if key == "unified" and isinstance(value, Mapping):
            others = unified_properties(value)[1]
            if others:
                raise InvalidArgument(f"resources.unified[{others[0]}] cannot be applied to a pod under the systemd "
                                      "cgroup driver: its cgroup is a slice systemd owns, and systemd has no "
                                      "property for that file (set it on each container)")
            continue
        if key not in _PROPERTY_KEYS:
            raise InvalidArgument(f"resources.{key} cannot be applied to a pod under the systemd cgroup driver: its "
                                  "cgroup is a slice systemd owns, and systemd has no property for it (set it on "
                                  "each container)")
        if key.startswith("cpuset_"):
            if not isinstance(value, str):
                raise InvalidArgument(f"resources.{key} must be a CPU list (such as 0-2,5), not {value!r}")
        elif not isinstance(value, int) or isinstance(value, bool) or value < -1:
            raise InvalidArgument(f"resources.{key} must be an integer >= -1, not {value!r}")
    swap, memory = resources.get("memory_swap_limit_bytes"), resources.get("memory_limit_bytes")
    if swap is not None and swap != -1 and (memory is None or memory == -1 or swap < memory):
        raise InvalidArgument("resources.memory_swap_limit_bytes: memory + swap needs a memory limit at most as large "
                              "in the same request")
    try:
        return unit_properties(resources)
    except ValueError:
        raise InvalidArgument(f"resources.cpuset_cpus/cpuset_mems: not CPU lists (such as 0-2,5): "
                              f"{resources.get('cpuset_cpus')!r}, {resources.get('cpuset_mems')!r}") from None


def _bitmask(cpu_list: str) -> bytes:
    """A cpuset list (``0-2,5``) as systemd's byte mask: bit N of byte N // 8 for CPU N."""
    mask = 0
    for part in cpu_list.split(","):
        low, _, high = part.partition("-")
        for cpu in range(int(low), int(high or low) + 1):
            mask |= 1 << cpu
    return mask.to_bytes(max(1, (mask.bit_length() + 7) // 8), "little")


class Placeholder:
    """A child of this process that only waits: a new scope's first process until the one it is
    for is in. It dies when released, and with this process (its parent-death signal)."""

    def __init__(self) -> None:
        read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC)
        old_mask = linux.block_all_signals()  # the child runs no Python handler
        try:
            pid = os.fork()
            if pid == 0:
                try:
                    linux.set_parent_death_signal(signal.SIGKILL)
                    # Nothing of the shim's is held open by it (a client waiting for EOF).
                    os.closerange(3, read_fd)
                    os.closerange(read_fd + 1, os.sysconf("SC_OPEN_MAX"))
                    os.read(read_fd, 1)  # EOF: released, or the parent gone
                finally:
                    os._exit(0)
        finally:
            linux.set_signal_mask(old_mask)
            os.close(read_fd)
        self.pid = pid

    def release(self) -> None:
        """Let the placeholder exit and reap it (unless the process's reaper does: either is fine)."""
        if self._write_fd < 0:
            return
        os.close(self._write_fd)
        self._write_fd = -1
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass  # the shim's reaper took it


class Manager:
    """systemd's manager over the system bus, spoken from an event loop: transient units started,
    changed and stopped, each call and each job awaited without blocking the loop (jeepney's
    asyncio router: the message core is jeepney's, the socket the loop's)."""

    def __init__(self, connection: Any, router: Any) -> None:
        self._connection = connection
        self._router = router

    @classmethod
    async def open(cls) -> Manager:
        """A connection to systemd, subscribed to its job signals. FailedPrecondition when the
        system bus or systemd cannot be reached."""
        from jeepney import message_bus
        from jeepney.io.asyncio import DBusRouter, open_dbus_connection

        try:
            connection = await asyncio.wait_for(open_dbus_connection(bus="SYSTEM"), START_TIMEOUT)
        except (OSError, KeyError, EOFError, TimeoutError) as exc:
            raise FailedPrecondition(f"the systemd cgroup driver cannot reach the system bus: {exc!r}") from None
        router = DBusRouter(connection)
        self = cls(connection, router)
        try:
            # JobRemoved is sent to subscribed clients only, and by the bus to those matching it.
            await self._send(message_bus.AddMatch(_job_removed_rule()))
            await self._call("Subscribe", "", ())
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """Stop the router's receiver and close the connection."""
        with contextlib.suppress(Exception):
            await self._router.__aexit__(None, None, None)
        with contextlib.suppress(Exception):
            await self._connection.close()

    async def _send(self, message: Any, timeout: float = START_TIMEOUT) -> Any:
        from jeepney import DBusErrorResponse
        from jeepney.io.asyncio import RouterClosed
        from jeepney.wrappers import unwrap_msg

        try:
            reply = await asyncio.wait_for(self._router.send_and_get_reply(message), timeout)
            return unwrap_msg(reply)
        except DBusErrorResponse as exc:
            raise _UnitError(exc.name, " ".join(str(d) for d in exc.data)) from None
        except TimeoutError:
            raise FailedPrecondition(f"the system bus did not answer within {timeout:.0f} s") from None
        except (RouterClosed, OSError, EOFError) as exc:
            raise FailedPrecondition(f"the connection to systemd on the system bus broke: {exc!r}") from None

    async def _call(self, method: str, signature: str, body: tuple[Any, ...], timeout: float = START_TIMEOUT) -> Any:
        from jeepney import DBusAddress, new_method_call

        name, path, interface = _SYSTEMD
        return await self._send(new_method_call(DBusAddress(path, bus_name=name, interface=interface), method,
                                                signature, body), timeout)

    async def _job(self, method: str, signature: str, body: tuple[Any, ...], unit: str, timeout: float) -> str:
        """Call a Manager method that queues a job on ``unit`` and wait for the job's end: its result
        ("done", "failed", ...)."""
        # Every JobRemoved of the system comes to the queue while this waits: it must not overflow.
        with self._router.filter(_job_removed_rule(), queue=asyncio.Queue()) as queue:
            (job,) = await self._call(method, signature, body, timeout)
            try:
                async with asyncio.timeout(timeout):
                    while True:
                        signal_body = (await queue.get()).body
                        if signal_body[1] == job:
                            return str(signal_body[3])
            except TimeoutError:
                raise FailedPrecondition(f"systemd did not finish {method} of {unit} within {timeout:.0f} s") from None

    async def start_scope(self, unit: str, parent_slice: str, pid: int, properties: list[tuple[str, tuple[str, Any]]],
                          timeout: float = START_TIMEOUT) -> None:
        """Start the transient scope ``unit`` in ``parent_slice`` with process ``pid``, delegated
        (as runc's systemd driver makes a container's: what is below it is ours) and
        ``properties``; return once systemd has started it. FailedPrecondition when systemd
        refuses it or its job fails."""
        await self._start(unit, parent_slice, [("Delegate", ("b", True)), ("PIDs", ("au", [pid])), *properties],
                          timeout)

    async def start_slice(self, unit: str, parent_slice: str, properties: list[tuple[str, tuple[str, Any]]],
                          timeout: float = START_TIMEOUT) -> None:
        """Start the transient slice ``unit`` in ``parent_slice`` with ``properties`` (a slice's
        name must extend its parent's: :func:`pod_slice_name`); as :meth:`start_scope`."""
        await self._start(unit, parent_slice, properties, timeout)

    async def _start(self, unit: str, parent_slice: str, properties: list[tuple[str, tuple[str, Any]]],
                     timeout: float) -> None:
        # A slice's parent is in its name; systemd refuses Slice= on one.
        where = [] if unit.endswith(".slice") else [("Slice", ("s", parent_slice))]
        props = [("Description", ("s", f"podshim {unit}")), *where, ("DefaultDependencies", ("b", False)),
                 ("CollectMode", ("s", "inactive-or-failed")), *properties]
        try:
            result = await self._job("StartTransientUnit", "ssa(sv)a(sa(sv))", (unit, "replace", props, []), unit,
                                     timeout)
        except _UnitError as exc:
            raise FailedPrecondition(f"systemd refused {unit} in {parent_slice}: {exc}") from None
        if result != "done":
            raise FailedPrecondition(f"systemd could not start {unit} in {parent_slice}: its job {result}")

    async def set_properties(self, unit: str, properties: list[tuple[str, tuple[str, Any]]]) -> None:
        """Set ``properties`` on ``unit`` until it stops (runtime). FailedPrecondition when refused."""
        if not properties:
            return
        try:
            await self._call("SetUnitProperties", "sba(sv)", (unit, True, properties))
        except _UnitError as exc:
            raise FailedPrecondition(f"systemd refused the properties of {unit}: {exc}") from None

    async def stop_unit(self, unit: str, timeout: float = START_TIMEOUT) -> None:
        """Stop ``unit`` and wait for it; a unit already gone is fine. FailedPrecondition when
        systemd cannot stop it."""
        try:
            result = await self._job("StopUnit", "ss", (unit, "replace"), unit, timeout)
        except _UnitError as exc:
            if exc.name in ("org.freedesktop.systemd1.NoSuchUnit", "org.freedesktop.systemd1.LoadFailed"):
                return
            raise FailedPrecondition(f"systemd could not stop {unit}: {exc}") from None
        if result not in ("done", "canceled"):
            raise FailedPrecondition(f"systemd could not stop {unit}: its job {result}")


class _UnitError(Exception):
    """An error reply of systemd's: its D-Bus error name and message."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{message} ({name})")
        self.name = name


#: This process's connection to systemd on each event loop it used (the shim has one loop).
_managers: dict[asyncio.AbstractEventLoop, tuple[int, Manager]] = {}


async def manager() -> Manager:
    """This process's connection to systemd on the running loop, opened at the first need (and
    again in a forked child, or on another loop)."""
    loop = asyncio.get_running_loop()
    for other in [other for other, (pid, _) in _managers.items() if other.is_closed() or pid != os.getpid()]:
        del _managers[other]  # a closed loop's, or the template's inherited across fork: never used
    if loop not in _managers:
        opened = await Manager.open()
        if loop in _managers:  # another task of this loop opened one meanwhile
            await opened.close()
        else:
            _managers[loop] = (os.getpid(), opened)
    return _managers[loop][1]


async def close_manager() -> None:
    """Close this process's connection to systemd on the running loop, if one is open (the loop's
    end: a connection left open is a socket the loop leaks)."""
    entry = _managers.pop(asyncio.get_running_loop(), None)
    if entry is not None:
        await entry[1].close()


def stop_unit_blocking(unit: str, timeout: float = START_TIMEOUT) -> None:
    """:meth:`Manager.stop_unit` for a caller without an event loop (``podshim delete``): on a
    loop and a connection of its own, closed after."""
    async def stop() -> None:
        own = await Manager.open()
        try:
            await own.stop_unit(unit, timeout)
        finally:
            await own.close()

    asyncio.run(stop())


def own_cgroup(pid: int) -> str:
    """The cgroup v2 path of process ``pid`` (/proc/PID/cgroup's ``0::`` line)."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].rstrip("\n")
    raise FailedPrecondition(f"process {pid} is in no cgroup v2 hierarchy")

