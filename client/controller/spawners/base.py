"""Spawners: how the Controller starts a shim, cleans up after a dead one, and lets it go.

A spawner has three coroutines, mirroring containerd's shim binary actions:

- ``spawn(namespace, sandbox_id, bundle) -> Bootstrap``: start a shim for the sandbox and say
  where it listens (``podshim start``);
- ``delete(namespace, sandbox_id, bundle) -> ExitStatus``: kill what is left of a shim that
  died or cannot be reached and remove what it made (``podshim delete``); never raises, a
  failed delete reports exit status 255 and now;
- ``release(namespace, sandbox_id)``: called once a sandbox was shut down (a systemd spawner
  stops its unit here; the exec spawner has nothing to do).

This module holds that contract (:class:`Spawner`); ``exec`` and ``systemd`` hold the two spawners.
"""

from __future__ import annotations

import abc

from client.controller.results import Bootstrap, ExitStatus

__all__ = ["Spawner", "stderr_tail"]

#: How much of a helper's stderr goes into an error message.
_STDERR_CHARS = 2000


class Spawner(abc.ABC):
    """How shims are started and cleaned up; see the module docstring for the contract."""

    @abc.abstractmethod
    async def spawn(self, namespace: str, sandbox_id: str, bundle: str) -> Bootstrap:
        """Start a shim for the sandbox whose bundle directory is ``bundle``; return where it
        listens. Raises an RpcError when the shim could not be started."""

    @abc.abstractmethod
    async def delete(self, namespace: str, sandbox_id: str, bundle: str) -> ExitStatus:
        """Clean up after a shim that is dead or unreachable; return how the sandbox ended
        (255 and now when that cannot be told; ``cleaned_up`` False when the cleanup did not
        finish). Never raises."""

    async def release(self, namespace: str, sandbox_id: str) -> None:  # noqa: B027 - a hook; by default nothing
        """Called after the sandbox was shut down and before its bundle is removed."""

    async def open(self) -> None:  # noqa: B027 - a hook; by default nothing
        """Called when a Controller that may change things opens. Never raises."""


def stderr_tail(stderr: bytes | None) -> str:
    """The end of what a helper wrote to stderr, for an error message."""
    text = (stderr or b"").decode(errors="replace").strip()
    return text[-_STDERR_CHARS:]
