"""``start`` and ``delete`` of ``containerd-shim-podshim-v1`` in their common case, on the
interpreter's built-in modules alone.

containerd runs the command twice in every pod's life and waits for it each time: ``start`` in
RunPodSandbox, ``delete`` in RemovePodSandbox (after ShutdownSandbox it closes the shim's
connection and waits for ``delete`` before it answers). Python itself starts in a few
milliseconds; the standard library's ``socket``, ``json``, ``signal``, ``typing`` and ``enum``,
and the wire's own modules, took each of the two commands to five times that. So here:

- ``start`` with a shim template serving the runtime root asks it for the shim (one
  ``Spawn`` call, protocol.md 7.5: the frame of protocol.md 2 and the few msgpack types the call
  needs, written and read here) and prints the BootstrapResult;
- ``delete`` of a sandbox whose shim finished a ShutdownSandbox (state.json ``shutdown``, naming
  no task, cgroup, netns, OCI container or rootfs, the pause's exit recorded) ends the shim, removes
  its socket, marks the record ``deleted`` and prints the pause's exit; as ``podshim delete`` does
  (:mod:`shim.cleanup`), and taking turns with it on the same lock.

Anything else (no template, a template that refuses, a record that names something left, input
that is not as expected) returns None, and the command takes its full path
(:mod:`shim.containerd.cli`), which does the same and more and says what is wrong.
"""

from __future__ import annotations

import _json
import _signal  # type: ignore[import-not-found]  # signal without its enums
import _socket
import fcntl
import os
import select
import time

from shim.api.defaults import DELETE_KILL_WAIT_TIMEOUT as KILL_WAIT_TIMEOUT
from shim.api.defaults import TEMPLATE_SPAWN_TIMEOUT as SPAWN_TIMEOUT
from shim.api.names import (
    DEFAULT_RUNTIME_ROOT,
    DELETE_LOCK_FILE,
    STATE_FILE,
    TEMPLATE_SERVICE,
    TEMPLATE_SOCKET,
    TEMPLATE_SOCKET_ENV,
)
from shim.containerd.bootstrap import bootstrap_params, bootstrap_result, delete_response

__all__ = ["start", "delete", "delete_clean"]

#: A state.json larger than this is not one a clean shutdown leaves.
MAX_STATE_BYTES = 1 << 16
_REQUEST, _RESPONSE = 1, 2  # frame types (protocol.md 2)


def start(flags: dict[str, str | bool], stdin: bytes, bundle: str) -> bytes | None:
    """The BootstrapResult of the shim the runtime root's template spawned for the sandbox of
    ``flags`` and ``stdin`` (containerd's BootstrapParams) in ``bundle`` (podshim's own, inside
    containerd's); None when no template answers with one."""
    root = os.environ.get("PODSHIM_RUNTIME_ROOT") or DEFAULT_RUNTIME_ROOT
    if not os.path.isabs(root):
        return None
    root = os.path.normpath(root)
    try:
        params = bootstrap_params(stdin)
    except ValueError:
        return None
    address = params.containerd_ttrpc_address or os.environ.get("TTRPC_ADDRESS", "")
    if not address:
        return None
    payload: dict[str, str | bool] = {
        "namespace": params.namespace or str(flags.get("namespace") or os.environ.get("NAMESPACE") or ""),
        "sandbox_id": params.instance_id or str(flags.get("id") or ""), "bundle": bundle,
        "runtime_root": root, "debug": bool(flags.get("debug")), "containerd_address": address}
    if os.environ.get("PODSHIM_PAUSE_BINARY"):
        payload["pause_binary"] = os.environ["PODSHIM_PAUSE_BINARY"]
    template = os.environ.get(TEMPLATE_SOCKET_ENV) or os.path.join(root, TEMPLATE_SOCKET)
    try:
        spawned = _call(template, TEMPLATE_SERVICE, "Spawn", payload, SPAWN_TIMEOUT)
    except (OSError, ValueError):
        return None
    if not isinstance(spawned, dict) or not isinstance(spawned.get("address"), str):
        return None
    return bootstrap_result(spawned["address"])


def _call(path: str, service: str, method: str, payload: dict[str, str | bool], timeout: float) -> object:
    """One msgpack call on the Unix socket ``path``: its payload, or None for an error status;
    OSError or ValueError when the socket or the answer is not what a podshim server gives."""
    request = _pack({"service": service, "method": method, "payload": payload, "timeout_nano": int(timeout * 1e9)})
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(len(request).to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes((_REQUEST, 0)) + request)
        data = b""
        while True:
            if len(data) >= 10 and len(data) >= 10 + int.from_bytes(data[:4], "big"):
                length, stream, kind = int.from_bytes(data[:4], "big"), int.from_bytes(data[4:8], "big"), data[8]
                if (stream, kind) != (1, _RESPONSE):
                    raise ValueError(f"frame of type {kind} on stream {stream}, not the response")
                response, end = _unpack(data[10:10 + length], 0)
                if end != length or not isinstance(response, dict) or not isinstance(response.get("status"), dict):
                    raise ValueError("the response is not one msgpack map with a status")
                return response.get("payload") if response["status"].get("code") == 0 else None
            chunk = sock.recv(65536)
            if not chunk:
                raise ValueError("the peer closed the connection without answering")
            data += chunk
    finally:
        sock.close()


def _pack(value: object) -> bytes:
    """The msgpack of a map of strings, booleans, non-negative ints and such maps."""
    if value is True or value is False:
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int) and 0 <= value < 1 << 64:
        return bytes((value,)) if value < 0x80 else b"\xcf" + value.to_bytes(8, "big")
    if isinstance(value, str):
        data = value.encode()
        return b"\xdb" + len(data).to_bytes(4, "big") + data
    if isinstance(value, dict):
        return b"\xdf" + len(value).to_bytes(4, "big") + b"".join(_pack(k) + _pack(v) for k, v in value.items())
    raise TypeError(f"cannot pack a {type(value).__name__}")


#: msgpack's fixed-size heads: nil, false, true; and the sized ones: (first byte) -> (bytes of the size, kind).
_CONSTANTS = {0xC0: None, 0xC2: False, 0xC3: True}
_SIZED = {0xC4: (1, "bin"), 0xC5: (2, "bin"), 0xC6: (4, "bin"), 0xD9: (1, "str"), 0xDA: (2, "str"), 0xDB: (4, "str"),
          0xDC: (2, "array"), 0xDD: (4, "array"), 0xDE: (2, "map"), 0xDF: (4, "map"),
          0xCC: (1, "uint"), 0xCD: (2, "uint"), 0xCE: (4, "uint"), 0xCF: (8, "uint"),
          0xD0: (1, "int"), 0xD1: (2, "int"), 0xD2: (4, "int"), 0xD3: (8, "int")}


def _unpack(data: bytes, pos: int) -> tuple[object, int]:
    """The msgpack value at ``pos`` of ``data`` (no floats or extension types) and where it ends;
    ValueError for anything else or data cut short."""
    if pos >= len(data):
        raise ValueError("msgpack data cut short")
    head = data[pos]
    pos += 1
    if head < 0x80 or head >= 0xE0:
        return (head if head < 0x80 else head - 0x100), pos
    if head in _CONSTANTS:
        return _CONSTANTS[head], pos
    if head <= 0x8F:
        kind, size = "map", head & 0x0F
    elif head <= 0x9F:
        kind, size = "array", head & 0x0F
    elif head <= 0xBF:
        kind, size = "str", head & 0x1F
    elif head in _SIZED:
        width, kind = _SIZED[head]
        size, pos = int.from_bytes(data[pos:pos + width], "big", signed=kind == "int"), pos + width
        if kind in ("uint", "int"):
            return size, pos
    else:
        raise ValueError(f"msgpack type 0x{head:02x} is not one a template answers with")
    if kind in ("str", "bin"):
        if pos + size > len(data):
            raise ValueError("msgpack data cut short")
        raw = data[pos:pos + size]
        return (raw.decode() if kind == "str" else raw), pos + size
    items = []
    for _ in range(size * 2 if kind == "map" else size):
        item, pos = _unpack(data, pos)
        items.append(item)
    if kind == "array":
        return items, pos
    return dict(zip(items[::2], items[1::2], strict=True)), pos


def delete(namespace: str, sandbox_id: str, bundle: str) -> bytes | None:
    """The DeleteResponse of the sandbox whose podshim bundle is ``bundle``, after a clean
    ShutdownSandbox, once its shim is gone and its socket removed; None when the record is not
    that of a clean shutdown (or cannot be read)."""
    ended = delete_clean(namespace, sandbox_id, bundle)
    return None if ended is None else delete_response(*ended)


def delete_clean(namespace: str, sandbox_id: str, bundle: str) -> tuple[int, int, int] | None:
    """:func:`delete`'s work: the pause's ``(pid, exit status, exited at)`` once the shim is gone
    and its socket removed; None when the record is not that of a clean shutdown."""
    try:
        lock = os.open(os.path.join(bundle, DELETE_LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_CREAT,
                       0o600)
    except OSError:
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(bundle, STATE_FILE)
        text = _read(path)
        record = _clean_shutdown(text, namespace, sandbox_id)
        if record is None:
            return None
        pid, exit_status, exited_at, shim_pid, shim_start_time, socket = record
        _kill(shim_pid, shim_start_time)
        try:
            os.unlink(socket)
        except FileNotFoundError:
            pass
        # What podshim delete leaves, so a delete after this one reports the same exit.
        _write(path, text.replace('"state": "shutdown"', '"state": "deleted"', 1))
        return pid, exit_status, exited_at
    except (OSError, ValueError):
        return None
    finally:
        os.close(lock)


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if os.fstat(fd).st_mode & 0o170000 != 0o100000:
            raise ValueError(f"{path} is not a regular file")
        data = os.read(fd, MAX_STATE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_STATE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_STATE_BYTES} bytes")
    return data.decode()


def _write(path: str, text: str) -> None:
    """Replace ``path`` as podshim's records are (shim.sandbox.record.write_state: a new file and a
    rename, not fsync'd; the new file named as shim.lib.files names its temporary files, so a
    delete after a crash here removes it as a leftover)."""
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.urandom(6).hex()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        data = text.encode()
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    os.replace(temporary, path)


class _Decoding:
    """What the JSON scanner of the interpreter's ``_json`` asks of its decoder (json.JSONDecoder's
    defaults): ``json`` itself, with ``re`` under it, costs a third of the command."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    memo: dict[str, str] = {}

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name.lower())


def _clean_shutdown(text: str, namespace: str, sandbox_id: str) -> tuple[int, int, int, int, int | None, str] | None:
    """``(pause pid, its exit status, exited at, shim pid, shim start time, socket path)`` of a
    state.json (version 1) whose shim finished a ShutdownSandbox and removed all it made; None
    for any other record."""
    try:
        doc, end = _json.make_scanner(_Decoding())(text, 0)  # type: ignore[arg-type]  # any object with its attributes
    except StopIteration:
        return None
    if text[end:].strip() or not isinstance(doc, dict) or text.count('"state": "shutdown"') != 1:
        return None
    pause, exit_, shim_start_time = doc.get("pause") or {}, doc.get("exit"), doc.get("shim_start_time")
    if not isinstance(pause, dict) or not isinstance(exit_, dict):
        return None
    clean = (doc.get("version") == 1 and doc.get("state") == "shutdown"
             and doc.get("namespace") in ("", namespace) and doc.get("sandbox_id") in ("", sandbox_id)
             and doc.get("tasks") == {} and doc.get("cgroup") is None and not doc.get("oci") and not doc.get("rootfs")
             and not (doc.get("netns_owned") and doc.get("netns_path"))
             and all(type(exit_.get(k)) is int for k in ("exit_status", "exited_at"))
             and type(pause.get("pid", 0)) is int and type(doc.get("shim_pid")) is int
             and (shim_start_time is None or type(shim_start_time) is int)
             and isinstance(doc.get("socket_path"), str) and os.path.isabs(doc["socket_path"]))
    if not clean:
        return None
    return (pause.get("pid", 0), exit_["exit_status"], exit_["exited_at"], doc["shim_pid"], shim_start_time,
            doc["socket_path"])


def _kill(pid: int, start_time: int | None) -> None:
    """SIGKILL the shim ``(pid, start_time)`` if it still runs, and wait until it is gone; a shim
    recorded without a start time is never signalled (its pid may be another process's)."""
    if pid <= 0 or start_time is None:
        return
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone (or the pid is now a thread of another process)
    try:
        # Compared once the pidfd holds the process: a pid reused after this cannot be signalled.
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        if fields[0] in (b"Z", b"X") or int(fields[19]) != start_time:  # fields 3 and 22 of proc(5)
            return
        try:
            _signal.pidfd_send_signal(fd, _signal.SIGKILL)
        except ProcessLookupError:
            return
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        deadline = time.monotonic() + KILL_WAIT_TIMEOUT
        while not poll.poll(max(0.0, deadline - time.monotonic()) * 1000) and time.monotonic() < deadline:
            pass
    finally:
        os.close(fd)
