"""How a shim was started (:class:`ShimConfig`): what ``podshim start|serve``, the template's Spawn
and containerd's ``start`` give it. Its own module, so the commands that only hand a config to
a template never load the sandbox's machinery.
"""

from __future__ import annotations

from shim.rpc.records import Record
from shim.rpc.records import set_field as _set

__all__ = ["ShimConfig"]


class ShimConfig(Record):
    """How this shim was started (the CLI flags of ``podshim start|serve``)."""

    __slots__ = ("namespace", "sandbox_id", "bundle", "socket_path", "runtime_root", "pause_binary",
                 "containerd_address")
    namespace: str
    sandbox_id: str
    bundle: str
    socket_path: str
    runtime_root: str
    pause_binary: str | None
    #: containerd's ttrpc address when containerd started the shim (containerd-shim-podshim-v1): it
    #: then also serves containerd's protobuf services (shim.containerd) and forwards events there.
    containerd_address: str | None

    def __init__(self, namespace: str, sandbox_id: str, bundle: str, socket_path: str, runtime_root: str,
                 pause_binary: str | None = None, containerd_address: str | None = None) -> None:
        _set(self, "namespace", namespace)
        _set(self, "sandbox_id", sandbox_id)
        _set(self, "bundle", bundle)
        _set(self, "socket_path", socket_path)
        _set(self, "runtime_root", runtime_root)
        _set(self, "pause_binary", pause_binary)
        _set(self, "containerd_address", containerd_address)
