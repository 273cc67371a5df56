"""ShimHandle: what the Controller knows about one sandbox and the connection to its shim.

A handle goes through the phases of :data:`TRANSITIONS`; only the Controller moves it along,
through :meth:`ShimHandle.move`, which refuses a move the table does not list:

                       +--- answers again ---+
                       v                     |
    PENDING --ok--> LIVE --connection lost, shim alive--> UNREACHABLE
       |              |                                       |
       |              +--------- shim process gone ---------+ |
       +--load: shim process gone--------------------------> DYING --cleanup done--> DEAD
       |                                                                              |
       +--create failed / never created / shut down--> GONE <-------- shutdown -------+

PENDING: being created or loaded, not usable yet (readers wait for ``settled``).
LIVE: connected to a shim that holds the sandbox.
UNREACHABLE: the shim's process runs but does not answer (stopped, overloaded, its connections
full, or our connection was dropped). Calls fail with UNAVAILABLE or DEADLINE_EXCEEDED and
leave it alone; the next call tries to reconnect, and only its process ending makes it DYING.
DYING/DEAD: the shim's process is gone; ``podshim delete`` ran (once) and ``exit`` says how it
ended.
GONE: forgotten; no longer in the NSMap.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from typing import Any

import anyio

from shim.rpc.client import Client
from shim.rpc.status import FailedPrecondition

from client.controller.bundles import BundleLock, ShimProcess
from client.controller.results import ControllerStatus, ExitStatus, SandboxState

__all__ = ["Phase", "TRANSITIONS", "ShimHandle"]


class Phase(enum.Enum):
    PENDING = "pending"
    LIVE = "live"
    UNREACHABLE = "unreachable"
    DYING = "dying"
    DEAD = "dead"
    GONE = "gone"


P = Phase
#: phase -> the phases a handle may move to from it. Anything else is a FailedPrecondition.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # created or loaded; loaded, alive, not answering; found gone on load; undone or skipped
    P.PENDING: frozenset({P.LIVE, P.UNREACHABLE, P.DYING, P.GONE}),
    # connection lost, shim alive; shim process gone; shut down
    P.LIVE: frozenset({P.UNREACHABLE, P.DYING, P.GONE}),
    # reconnected; shim process gone (or shut down and deleted); never created, or shut down
    P.UNREACHABLE: frozenset({P.LIVE, P.DYING, P.GONE}),
    P.DYING: frozenset({P.DEAD}),   # cleanup done (``exit`` is set)
    P.DEAD: frozenset({P.GONE}),    # the tombstone is shut down
    P.GONE: frozenset(),            # forgotten: nothing comes after
}
#: What a handle in each phase is, for the sentence of a refused move.
_DESCRIPTIONS = {
    P.PENDING: "is still being created or loaded",
    P.LIVE: "is served by its shim",
    P.UNREACHABLE: "has a shim that runs but does not answer",
    P.DYING: "is being cleaned up after its shim died",
    P.DEAD: "has exited and its shim is gone",
    P.GONE: "was shut down and forgotten",
}
#: Phases whose shim went away: the sandbox reads as stopped, with the exit status of its cleanup.
ENDED = frozenset({P.DYING, P.DEAD})


class ShimHandle:
    """One sandbox of the Controller. ``lock`` serialises the operations that change the
    sandbox (create, start, stop, shutdown); reads do not take it, so a long stop never
    delays a status and a wait never blocks a stop."""

    def __init__(self, namespace: str, sandbox_id: str, bundle: str):
        self.namespace = namespace
        self.sandbox_id = sandbox_id
        self.bundle = bundle
        self.phase = Phase.PENDING
        self.lock = anyio.Lock()
        self.settled = anyio.Event()  # PENDING is over
        self.dead = anyio.Event()     # DEAD: ``exit`` is final
        self.client: Client | None = None
        self.address = ""
        self.version = 0
        #: The shim's process: whether it runs decides whether the shim is dead. None when
        #: nothing names it (a bundle without bootstrap pid or state.json).
        self.process: ShimProcess | None = None
        #: The shim said it holds the sandbox (CreateSandbox or a SandboxStatus answered).
        self.confirmed = False
        #: Why the shim is UNREACHABLE, for the errors of calls meanwhile.
        self.unreachable_reason = ""
        #: Serialises what decides between LIVE, UNREACHABLE and DYING: reconnecting, and
        #: judging a lost connection.
        self.reach_lock = anyio.Lock()
        #: Cancels the task that waits for the process of an UNREACHABLE shim to exit.
        self.watch_scope: anyio.CancelScope | None = None
        #: We close the connection ourselves (shutdown, controller close): not a death.
        self.closing = False
        # Last known facts, for a tombstone and for list() when a shim does not answer in time.
        self.pid = 0
        self.state: str = SandboxState.UNKNOWN
        self.created_at = 0
        self.exit: ExitStatus | None = None
        #: The shim is gone and a read-only Controller left its sandbox as it found it.
        self.uncleaned = False
        #: The shim is gone and ``podshim delete`` did not finish: the bundle is kept (its record
        #: names what is left), and a shutdown deletes again before it forgets the sandbox.
        self.cleanup_unfinished = False
        #: The bundle's flock (make_bundle hands it the new bundle's, held).
        self.bundle_lock = BundleLock(bundle)
        self._bundle_holds = 0

    @contextlib.contextmanager
    def hold_bundle(self) -> Iterator[bool]:
        """Hold the bundle's flock for a block; yields False when another process holds it (or
        the bundle is gone). Re-entrant within this process: a flock taken through a second
        descriptor would conflict with our own, and a shutdown and a dead-shim cleanup of the
        same handle may overlap (the handle's phase decides which of them acts)."""
        if self._bundle_holds == 0 and not self.bundle_lock.try_acquire():
            yield False
            return
        self._bundle_holds += 1
        try:
            yield True
        finally:
            self._bundle_holds -= 1
            if self._bundle_holds == 0:
                self.bundle_lock.release()

    def move(self, phase: Phase) -> None:
        """Move to ``phase``; raises FailedPrecondition when :data:`TRANSITIONS` does not allow it
        (the sandbox keeps its phase). Leaving PENDING wakes the readers waiting on ``settled``."""
        if phase not in TRANSITIONS[self.phase]:
            raise FailedPrecondition(f"sandbox {self.sandbox_id} in namespace {self.namespace} "
                                     f"{_DESCRIPTIONS[self.phase]}; it cannot become {phase.value}")
        self.phase = phase
        self.settled.set()

    def stop_watching(self) -> None:
        """End the wait for the shim's process to exit, if one runs (idempotent)."""
        if self.watch_scope is not None:
            self.watch_scope.cancel()
            self.watch_scope = None

    def remember(self, status: dict[str, Any]) -> None:
        """Keep what a SandboxStatus answer said (the shim holds the sandbox)."""
        self.confirmed = True
        self.pid = status.get("pid") or 0
        self.state = status.get("state") or self.state
        self.created_at = status.get("created_at") or self.created_at

    def cached_status(self) -> ControllerStatus:
        """The status from what is known without asking the shim (a tombstone's, after death)."""
        exit_status = self.exit.exit_status if self.exit else 0
        exited_at = self.exit.exited_at if self.exit else 0
        state = SandboxState.STOPPED if self.phase in ENDED else self.state
        info = {"unreachable": self.unreachable_reason} if self.phase is Phase.UNREACHABLE else {}
        if self.uncleaned:
            info = {"cleanup": "not done: its shim is gone and nothing was changed (read-only); shutting the "
                               "sandbox down cleans up after it"}
        elif self.cleanup_unfinished:
            info = {"cleanup": "not finished: podshim delete failed after its shim died (see the log); shutting "
                               "the sandbox down cleans up again"}
        return ControllerStatus(self.sandbox_id, self.pid, state, info, self.created_at, exited_at, exit_status,
                                self.address, self.version, self.namespace)

    def __repr__(self) -> str:
        return f"<ShimHandle {self.namespace}/{self.sandbox_id} {self.phase.value} pid={self.pid}>"
