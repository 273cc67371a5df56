"""What the Controller returns: frozen dataclasses shaped like containerd's sandbox.Controller.

Timestamps are int nanoseconds since the Unix epoch (0 = unset), as on the wire.
:class:`Bootstrap` also parses what ``podshim start`` prints (protocol.md, "Bootstrap").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from shim.api.names import BOOTSTRAP_FILE, BOOTSTRAP_VERSION, PROTOCOL, UNKNOWN_EXIT_STATUS
from shim.lib.files import decode_json
from shim.rpc.status import Internal, Unimplemented

__all__ = [
    "BOOTSTRAP_FILE",
    "BOOTSTRAP_VERSION",
    "PROTOCOL",
    "UNKNOWN_EXIT_STATUS",
    "Bootstrap",
    "ExitStatus",
    "ControllerInstance",
    "ControllerStatus",
    "Platform",
    "SandboxState",
]


class SandboxState(enum.StrEnum):
    """The states a sandbox reports (the shim's, protocol.md 7.1); they compare equal to the
    strings on the wire. A state this client does not know is kept as the shim's string."""

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"
    #: Nothing was heard from the shim yet.
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """How to reach a shim: what ``podshim start`` printed and wrote to bootstrap.json."""

    version: int
    address: str
    protocol: str
    pid: int
    #: The shim's start time (clock ticks since boot, /proc/PID/stat field 22); None when the
    #: document has none (an older shim, or a pid not known yet).
    start_time: int | None = None

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "bootstrap JSON") -> Bootstrap:
        """Parse and check a bootstrap document.

        Raises Internal when ``text`` is not a bootstrap document (``source`` names where it
        came from, for the message) and Unimplemented for a version or protocol we do not speak.
        """
        try:
            doc = decode_json(text, source)
        except ValueError as exc:
            shown = text[:200] if isinstance(text, str) else text[:200].decode(errors="replace")
            raise Internal(f"{exc}: {shown!r}") from None
        return cls.from_dict(doc, source=source)

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "bootstrap JSON") -> Bootstrap:
        """Check a decoded bootstrap document; raises like :meth:`from_json`."""
        if not isinstance(doc, dict):
            raise Internal(f"{source} is not a JSON object: {doc!r:.200}")
        version, address, protocol, pid = (doc.get(k) for k in ("version", "address", "protocol", "pid"))
        if not isinstance(version, int) or isinstance(version, bool):
            raise Internal(f"{source} has no integer 'version': {doc!r:.200}")
        if version != BOOTSTRAP_VERSION:
            raise Unimplemented(f"{source}: shim bootstrap version {version} is not supported "
                                f"(this controller speaks version {BOOTSTRAP_VERSION})")
        if protocol != PROTOCOL:
            raise Unimplemented(f"{source}: shim protocol {protocol!r} is not supported (expected {PROTOCOL!r})")
        if not isinstance(address, str) or not address.startswith("unix:///"):
            raise Internal(f"{source} has no 'address' of the form unix:///path: {address!r}")
        # pid 0 is legal: `podshim start` prints it when it found a live shim it did not start.
        if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
            raise Internal(f"{source} has no valid 'pid': {pid!r}")
        # Optional: a shim before it was added wrote none.
        start_time = doc.get("start_time")
        if start_time is not None and (not isinstance(start_time, int) or isinstance(start_time, bool)
                                       or start_time < 0):
            raise Internal(f"{source} has no valid 'start_time': {start_time!r}")
        return cls(version, address, protocol, pid, start_time)


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a sandbox ended: ``exit_status`` (128 + signal when killed) and when. A spawner's
    ``delete`` that did not finish (``podshim delete`` failed or ran out of time, killed half-way)
    says so with ``cleaned_up`` False: what it had still to remove is left, named by the bundle."""

    exit_status: int
    exited_at: int
    cleaned_up: bool = True


@dataclass(frozen=True, slots=True)
class Platform:
    """The OCI platform of a sandbox (GOARCH names)."""

    os: str
    architecture: str
    variant: str = ""


@dataclass(frozen=True, slots=True)
class ControllerInstance:
    """What :meth:`Controller.start` returns: the running sandbox and how to reach its shim."""

    sandbox_id: str
    pid: int
    created_at: int
    address: str
    version: int
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ControllerStatus:
    """A sandbox's status. ``state`` is the shim's (created, running, stopped); a sandbox whose
    shim died is "stopped" with the exit status its cleanup found."""

    sandbox_id: str
    pid: int
    state: str
    info: dict[str, str]
    created_at: int
    exited_at: int
    exit_status: int
    address: str
    version: int
    namespace: str = ""
