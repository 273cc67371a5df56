"""A task's process confinement (protocol.md 7.3, Task.Create): its user and groups, its
capabilities, no_new_privs and its seccomp filter.

Three parts, one per place they run:

- :func:`from_request` reads and checks the Create fields (InvalidArgument naming the field),
  once, in the Task service, for every runtime handler; the result is a :class:`Confinement`.
- :func:`steps` (the shim, before the fork) turns it into the list of calls the native
  launcher's child makes, with everything computed: the capability masks, the capset
  structures and the compiled seccomp program, so the child only makes system calls.
- :mod:`shim.runtime.process` runs those steps last, right before exec, in runc's order: the
  bounding set, (the filter, when no_new_privs is off: loading it then needs CAP_SYS_ADMIN,
  which the uid change and capset take away), setgroups/setgid/setuid with the permitted set
  kept (PR_SET_KEEPCAPS), capset (effective = permitted = the list, inheritable and ambient
  empty), no_new_privs, and the filter last, so it filters as little of our own work as can be.

runc and crun get the same in config.json (:func:`shim.runtime.oci.spec.task_spec`).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping
from typing import Any

from shim.api.defaults import DEFAULT_CAPABILITIES
from shim.kernel import capabilities as caps
from shim.kernel import seccomp
from shim.rpc.records import Record
from shim.rpc.records import set_field as _set
from shim.rpc.status import InvalidArgument

__all__ = ["MAX_GROUPS", "Confinement", "from_request", "steps"]

MAX_GROUPS = 65536  # NGROUPS_MAX
_MAX_ID = 2**32 - 2  # uid_t/gid_t; -1 (2**32 - 1) means "unchanged" to the kernel
_PR_SET_NO_NEW_PRIVS = 38


class Confinement(Record):
    """What a task's process is confined to; the defaults are what a Create without the fields gets."""

    __slots__ = ("uid", "gid", "additional_gids", "capabilities", "no_new_privileges", "seccomp")
    uid: int
    gid: int
    additional_gids: tuple[int, ...]
    capabilities: tuple[str, ...]
    no_new_privileges: bool
    seccomp: Mapping[str, Any] | None

    def __init__(self, uid: int = 0, gid: int = 0, additional_gids: tuple[int, ...] = (),
                 capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES, no_new_privileges: bool = False,
                 seccomp: Mapping[str, Any] | None = None) -> None:
        _set(self, "uid", uid)
        _set(self, "gid", gid)
        _set(self, "additional_gids", additional_gids)
        _set(self, "capabilities", capabilities)
        _set(self, "no_new_privileges", no_new_privileges)
        _set(self, "seccomp", seccomp)


def _id(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_ID:
        raise InvalidArgument(f"field {field!r} must be an integer in 0..{_MAX_ID}, got {value!r}")
    return value


def from_request(payload: Mapping[str, Any]) -> Confinement:
    """The confinement Task.Create asks for (fields ``user``, ``capabilities``,
    ``no_new_privileges``, ``seccomp``; absent or nil: the default).

    InvalidArgument naming the field: a malformed user, an unknown capability name (or one this
    kernel does not know), a capability the shim itself does not hold (it cannot give it), a
    seccomp profile runc would refuse or libseccomp cannot compile.
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
    return Confinement(**fields)


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

    out: list[tuple[str, Callable[[], None]]] = []
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
