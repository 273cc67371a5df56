"""The protobuf messages of the shim command (``start``'s BootstrapParams and BootstrapResult,
``delete``'s DeleteResponse), read and written here with nothing but built-in types: containerd
runs the command twice in every pod's life and waits for it each time, and neither the protobuf
runtime nor the wire's own protobuf helpers (:mod:`shim.rpc.protowire`, which pull in the wire's
messages and status codes) are worth their import for three small messages
(:mod:`shim.containerd.fastpath`).

The field numbers are those of containerd's API module (``runtime/bootstrap/v1/bootstrap.proto``,
``runtime/task/v2/shim.proto``); tests/containerd/test_shim_protocol.py reads and writes the same
messages with the generated code.
"""

from __future__ import annotations

__all__ = ["BootstrapParams", "bootstrap_params", "bootstrap_result", "delete_response"]

#: BootstrapParams' string fields start reads, by number.
_PARAMS = {1: "instance_id", 2: "namespace", 5: "containerd_ttrpc_address"}
#: Protobuf's wire types: the two these messages use, and the fixed-width ones skipped.
_VARINT, _LEN, _FIXED = 0, 2, {1: 8, 5: 4}


class BootstrapParams:
    """What ``start`` reads of containerd's BootstrapParams ("" for a field not given)."""

    __slots__ = ("instance_id", "namespace", "containerd_ttrpc_address")

    def __init__(self, instance_id: str = "", namespace: str = "", containerd_ttrpc_address: str = "") -> None:
        self.instance_id = instance_id
        self.namespace = namespace
        self.containerd_ttrpc_address = containerd_ttrpc_address


def bootstrap_params(data: bytes) -> BootstrapParams:
    """The BootstrapParams of ``data``; ValueError when it is not a protobuf message whose fields
    read are UTF-8 strings."""
    params = BootstrapParams()
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, kind = key >> 3, key & 7
        if kind == _VARINT:
            _, pos = _read_varint(data, pos)
            value = None
        elif kind == _LEN:
            length, pos = _read_varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif kind in _FIXED:
            value, pos = None, pos + _FIXED[kind]
        else:
            raise ValueError(f"BootstrapParams is not valid protobuf: wire type {kind} of field {number}")
        if pos > len(data) or number == 0:
            raise ValueError(f"BootstrapParams is not valid protobuf: field {number} is cut short")
        if number in _PARAMS:
            if value is None:
                raise ValueError(f"BootstrapParams field {_PARAMS[number]} must be a string")
            setattr(params, _PARAMS[number], value.decode())  # UnicodeDecodeError is a ValueError
    return params


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            break
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    raise ValueError("BootstrapParams is not valid protobuf: a varint is cut short")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes((value,)))


def _string(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(len(data)) + data


def _number(number: int, value: int) -> bytes:
    """A varint field of a non-negative ``value``; nothing for 0 (proto3's default)."""
    return _varint(number << 3 | _VARINT) + _varint(value) if value else b""


def bootstrap_result(address: str, protocol: str = "ttrpc", version: int = 3) -> bytes:
    """A BootstrapResult: ``version`` (1), ``address`` (2), ``protocol`` (3)."""
    return _number(1, version) + _string(2, address.encode()) + _string(3, protocol.encode())


def delete_response(pid: int, exit_status: int, exited_at_ns: int) -> bytes:
    """A task v2 DeleteResponse: ``pid`` (1), ``exit_status`` (2), ``exited_at`` (3, a
    Timestamp: seconds 1, nanos 2; unset for 0)."""
    seconds, nanos = divmod(exited_at_ns, 1_000_000_000)
    exited_at = _string(3, _number(1, seconds) + _number(2, nanos)) if exited_at_ns else b""
    return _number(1, pid) + _number(2, exit_status) + exited_at
