"""The protobuf messages of the shim command (``start``'s BootstrapParams and BootstrapResult,
``delete``'s DeleteResponse), spoken with the wire's field helpers (:mod:`shim.rpc.protowire`)
instead of the generated code: containerd runs the command twice in every pod's life, and the
protobuf runtime with containerd's generated modules costs more to load than the rest of it.

The field numbers are those of containerd's API module (``runtime/bootstrap/v1/bootstrap.proto``,
``runtime/task/v2/shim.proto``); tests/containerd/test_shim_protocol.py reads and writes the same
messages with the generated code.
"""

from __future__ import annotations

from shim.rpc.protowire import LEN, field, fields, int_field, text

__all__ = ["BootstrapParams", "bootstrap_params", "bootstrap_result", "delete_response"]

#: BootstrapParams' string fields start reads, by number.
_PARAMS = {1: "instance_id", 2: "namespace", 5: "containerd_ttrpc_address"}


class BootstrapParams:
    """What ``start`` reads of containerd's BootstrapParams ("" for a field not given)."""

    __slots__ = ("instance_id", "namespace", "containerd_ttrpc_address")

    def __init__(self, instance_id: str = "", namespace: str = "", containerd_ttrpc_address: str = "") -> None:
        self.instance_id = instance_id
        self.namespace = namespace
        self.containerd_ttrpc_address = containerd_ttrpc_address


def bootstrap_params(data: bytes) -> BootstrapParams:
    """The BootstrapParams of ``data``; InvalidArgument when it is not a protobuf message whose
    fields read are strings."""
    found = {_PARAMS[number]: text(value, f"BootstrapParams field {_PARAMS[number]}")
             for number, kind, value in fields(data, "BootstrapParams") if number in _PARAMS and kind == LEN}
    return BootstrapParams(**found)


def bootstrap_result(address: str, protocol: str = "ttrpc", version: int = 3) -> bytes:
    """A BootstrapResult: ``version`` (1), ``address`` (2), ``protocol`` (3)."""
    return int_field(1, version) + field(2, address.encode()) + field(3, protocol.encode())


def delete_response(pid: int, exit_status: int, exited_at_ns: int) -> bytes:
    """A task v2 DeleteResponse: ``pid`` (1), ``exit_status`` (2), ``exited_at`` (3, a
    Timestamp: seconds 1, nanos 2; unset for 0)."""
    seconds, nanos = divmod(exited_at_ns, 1_000_000_000)
    exited_at = field(3, int_field(1, seconds) + int_field(2, nanos)) if exited_at_ns else b""
    return int_field(1, pid) + int_field(2, exit_status) + exited_at
