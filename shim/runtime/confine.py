"""A task's process confinement (protocol.md 7.3, Task.Create): its user and groups, its
capabilities, no_new_privs, its seccomp filter and its resource limits (rlimits).

Three parts, one per place they run:

- :func:`from_request` reads and checks the Create fields (InvalidArgument naming the field),
  once, in the Task service, for every runtime handler; the result is a :class:`Confinement`.
- :func:`steps` (the shim, before the fork) turns it into the list of calls the native
  launcher's child makes, with everything computed: the capability masks, the capset
  structures and the compiled seccomp program, so the child only makes system calls.
- :mod:`shim.runtime.process` runs those steps last, right before exec, in runc's order: the
  rlimits (setrlimit, while it may still raise a hard limit as far as the shim may), the
  bounding set, (the filter, when no_new_privs is off: loading it then needs CAP_SYS_ADMIN,
  which the uid change and capset take away), setgroups/setgid/setuid with the permitted set
  kept (PR_SET_KEEPCAPS), capset (effective = permitted = the list, inheritable and ambient
  empty), no_new_privs, and the filter last, so it filters as little of our own work as can be.

runc and crun get the same in config.json (:func:`shim.runtime.oci.spec.task_spec`).
"""

from __future__ import annotations

import ctypes
import os
import resource
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shim.api.defaults import DEFAULT_CAPABILITIES
from shim.kernel import capabilities as caps
from shim.kernel import seccomp
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import FailedPrecondition, InvalidArgument

__all__ = ["MAX_GROUPS", "RLIMITS", "Confinement", "Rlimit", "from_request", "oci_rlimits", "parse_rlimits", "steps"]

MAX_GROUPS = 65536  # NGROUPS_MAX
_MAX_ID = 2**32 - 2  # uid_t/gid_t; -1 (2**32 - 1) means "unchanged" to the kernel
_PR_SET_NO_NEW_PRIVS = 38
_RLIM_MAX = 2**64 - 1  # an OCI rlimit's unlimited (RLIM_INFINITY)

#: The resource limits the OCI runtime specification lists (process.rlimits' types): their numbers
#: in Linux's generic ABI (Python's resource module lacks some, such as RLIMIT_LOCKS).
RLIMITS: dict[str, int] = {
    "RLIMIT_CPU": 0, "RLIMIT_FSIZE": 1, "RLIMIT_DATA": 2, "RLIMIT_STACK": 3, "RLIMIT_CORE": 4, "RLIMIT_RSS": 5,
    "RLIMIT_NPROC": 6, "RLIMIT_NOFILE": 7, "RLIMIT_MEMLOCK": 8, "RLIMIT_AS": 9, "RLIMIT_LOCKS": 10,
    "RLIMIT_SIGPENDING": 11, "RLIMIT_MSGQUEUE": 12, "RLIMIT_NICE": 13, "RLIMIT_RTPRIO": 14, "RLIMIT_RTTIME": 15}


class Rlimit(Record):
    """One resource limit of the process: ``type`` (an ``RLIMIT_*`` name of :data:`RLIMITS`),
    ``soft`` and ``hard`` (2**64 - 1: unlimited)."""

    __slots__ = ("type", "soft", "hard")
    type: str
    soft: int
    hard: int

    def __init__(self, type: str, soft: int, hard: int) -> None:  # noqa: A002 - the OCI field's name
        _set(self, "type", type)
        _set(self, "soft", soft)
        _set(self, "hard", hard)

    def apply(self) -> None:
        """setrlimit in the calling process."""
        resource.setrlimit(RLIMITS[self.type], (_resource_value(self.soft), _resource_value(self.hard)))

    def to_oci(self) -> dict[str, Any]:
        return {"type": self.type, "soft": self.soft, "hard": self.hard}


class Confinement(Record):
    """What a task's process is confined to; the defaults are what a Create without the fields gets."""

    __slots__ = ("uid", "gid", "additional_gids", "capabilities", "no_new_privileges", "seccomp", "rlimits")
    uid: int
    gid: int
    additional_gids: tuple[int, ...]
    capabilities: tuple[str, ...]
    no_new_privileges: bool
    seccomp: Mapping[str, Any] | None
    rlimits: tuple[Rlimit, ...]  # () : the shim's own limits, inherited

    def __init__(self, uid: int = 0, gid: int = 0, additional_gids: tuple[int, ...] = (),
                 capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES, no_new_privileges: bool = False,
                 seccomp: Mapping[str, Any] | None = None, rlimits: tuple[Rlimit, ...] = ()) -> None:
        _set(self, "uid", uid)
        _set(self, "gid", gid)
        _set(self, "additional_gids", additional_gids)
        _set(self, "capabilities", capabilities)
        _set(self, "no_new_privileges", no_new_privileges)
        _set(self, "seccomp", seccomp)
        _set(self, "rlimits", rlimits)


def _id(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_ID:
        raise InvalidArgument(f"field {field!r} must be an integer in 0..{_MAX_ID}, got {value!r}")
    return value


def from_request(payload: Mapping[str, Any]) -> Confinement:
    """The confinement Task.Create asks for (fields ``user``, ``capabilities``,
    ``no_new_privileges``, ``seccomp``, ``rlimits``; absent or nil: the default).

    InvalidArgument naming the field: a malformed user, an unknown capability name (or one this
    kernel does not know), a capability the shim itself does not hold (it cannot give it), a
    seccomp profile runc would refuse or libseccomp cannot compile, an rlimit of no known type,
    given twice or whose soft limit is above its hard one. FailedPrecondition naming the limit:
    a hard limit above the shim's own while the shim lacks CAP_SYS_RESOURCE (never lowered).
    """
    fields: dict[str, Any] = {}
    user = payload.get("user")
    if user is not None:
        if not isinstance(user, Mapping):
            raise InvalidArgument("field 'user' must be a map {uid, gid, additional_gids}")
        unknown = sorted(set(user) - {"uid", "gid", "additional_gids"})
        if unknown:
            raise InvalidArgument(f"field 'user.{unknown[0]}' is not a field of user (uid, gid, additional_gids)")
        fields["uid"] = _id(user.get("uid", 0), "user.uid")
        fields["gid"] = _id(user.get("gid", 0), "user.gid")
        gids = user.get("additional_gids") or []
        if not isinstance(gids, list) or len(gids) > MAX_GROUPS:
            raise InvalidArgument(f"field 'user.additional_gids' must be an array of at most {MAX_GROUPS} gids")
        fields["additional_gids"] = tuple(dict.fromkeys(_id(g, "user.additional_gids") for g in gids))
    names = payload.get("capabilities")
    if names is not None:
        fields["capabilities"] = _capabilities(names)
    nnp = payload.get("no_new_privileges")
    if nnp is not None:
        if not isinstance(nnp, bool):
            raise InvalidArgument(f"field 'no_new_privileges' must be bool, got {type(nnp).__name__}")
        fields["no_new_privileges"] = nnp
    profile = payload.get("seccomp")
    if profile is not None:
        try:
            seccomp.validate(profile)
            seccomp.compile_profile(profile)  # what libseccomp refuses is refused here, for every handler
        except seccomp.ProfileError as exc:
            raise InvalidArgument(f"field 'seccomp': {exc}") from None
        fields["seccomp"] = profile
    limits = payload.get("rlimits")
    if limits is not None:
        fields["rlimits"] = parse_rlimits(limits)
    return Confinement(**fields)


def parse_rlimits(entries: Any, field: str = "rlimits") -> tuple[Rlimit, ...]:
    """The ``rlimits`` field (an array of ``{type, soft, hard}``), checked as :func:`from_request` says."""
    if not isinstance(entries, list):
        raise InvalidArgument(f"field {field!r} must be an array of {{type, soft, hard}}")
    limits: dict[str, Rlimit] = {}
    for i, entry in enumerate(entries):
        where = f"{field}[{i}]"
        if not isinstance(entry, Mapping):
            raise InvalidArgument(f"field {where!r} must be a map {{type, soft, hard}}")
        kind = entry.get("type")
        if kind not in RLIMITS:
            raise InvalidArgument(f"field '{where}.type' must be one of {', '.join(RLIMITS)}, not {kind!r}")
        if kind in limits:
            raise InvalidArgument(f"field {field!r}: {kind} is given twice")
        values = []
        for key in ("soft", "hard"):
            value = entry.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _RLIM_MAX:
                raise InvalidArgument(f"field '{where}.{key}' must be an integer in 0..{_RLIM_MAX}, got {value!r}")
            values.append(value)
        soft, hard = values
        if soft > hard:
            raise InvalidArgument(f"field {where!r}: {kind}'s soft limit {soft} is above its hard limit {hard}")
        limits[kind] = Rlimit(kind, soft, hard)
    _check_hard_limits(limits.values())
    return tuple(limits.values())


def _check_hard_limits(limits: Iterable[Rlimit]) -> None:
    """FailedPrecondition naming the first limit whose hard value is above the shim's own when the
    shim may not raise it (it lacks CAP_SYS_RESOURCE): it would be refused at exec, or lowered."""
    if caps.current("CapEff") >> caps.CAPABILITIES["CAP_SYS_RESOURCE"] & 1:
        return
    for limit in limits:
        own = resource.getrlimit(RLIMITS[limit.type])[1]
        own = _RLIM_MAX if own == resource.RLIM_INFINITY else own
        if limit.hard > own:
            raise FailedPrecondition(f"{limit.type}'s hard limit {limit.hard} cannot be given: it is above the "
                                     f"shim's own ({own}) and the shim lacks CAP_SYS_RESOURCE to raise it")


def oci_rlimits(confinement: Confinement) -> list[dict[str, Any]]:
    """config.json's ``process.rlimits``."""
    return [limit.to_oci() for limit in confinement.rlimits]


def _resource_value(value: int) -> int:
    return resource.RLIM_INFINITY if value == _RLIM_MAX else value


def _capabilities(names: Any) -> tuple[str, ...]:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidArgument("field 'capabilities' must be an array of CAP_* names")
    last = caps.last_cap()
    for name in names:
        if caps.CAPABILITIES.get(name, last + 1) > last:
            raise InvalidArgument(f"field 'capabilities': {name!r} is not a capability this kernel knows")
    missing = caps.mask(names) & ~caps.current("CapPrm")
    if missing:
        raise InvalidArgument(f"field 'capabilities': {', '.join(caps.names(missing))} cannot be given: the shim "
                              "does not hold it (it is not in this host's bounding set)")
    return tuple(dict.fromkeys(names))


def steps(confinement: Confinement | None) -> tuple[tuple[str, Callable[[], None]], ...]:
    """The calls the native launcher's child makes right before exec, each with the step it
    reports on failure; computed here, in the parent (masks, capset structures, the filter)."""
    if confinement is None:
        return ()
    c = confinement
    keep = caps.mask(c.capabilities)
    dropped = [n for n in range(caps.last_cap() + 1) if not keep >> n & 1]
    capset_args = caps.capset_args(keep, keep, 0)
    program = None
    if c.seccomp is not None:
        program = seccomp.Program(seccomp.compile_profile(c.seccomp), c.seccomp.get("flags") or ())

    def drop_bounding() -> None:
        for number in dropped:
            caps.drop_bounding(number)

    def load_filter() -> None:
        seccomp.load(program)  # type: ignore[arg-type]

    out: list[tuple[str, Callable[[], None]]] = [
        (f"setrlimit({limit.type}, {limit.soft}, {limit.hard})", limit.apply) for limit in c.rlimits]
    if c.uid != 0:
        out.append(("prctl(PR_SET_KEEPCAPS)", lambda: caps.set_keepcaps(True)))
    out.append(("dropping capabilities from the bounding set", drop_bounding))
    out.append(("clearing the ambient capabilities", caps.clear_ambient))
    if program is not None and not c.no_new_privileges:
        out.append(("loading the seccomp filter", load_filter))
    groups = list(c.additional_gids)
    out.append((f"setgroups({groups})", lambda: os.setgroups(groups)))
    out.append((f"setgid({c.gid})", lambda: os.setresgid(c.gid, c.gid, c.gid)))
    out.append((f"setuid({c.uid})", lambda: os.setresuid(c.uid, c.uid, c.uid)))
    out.append(("capset", lambda: caps.capset(capset_args)))
    if c.no_new_privileges:
        out.append(("prctl(PR_SET_NO_NEW_PRIVS)", _set_no_new_privs))
        if program is not None:
            out.append(("loading the seccomp filter", load_filter))
    return tuple(out)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _set_no_new_privs() -> None:
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
