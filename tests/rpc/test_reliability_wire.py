"""A live shim under bad input and load: it answers each bad frame with a status or closes only
that connection, keeps serving, does not grow without bound, and refuses other users."""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import time

import msgpack
import pytest

from shim.api.names import SANDBOX_SERVICE, TASK_SERVICE
from shim.rpc import Client
from shim.rpc.connection import ClientConnection, ResponseReceived
from shim.rpc.frames import HEADER, MAX_DATA_BYTES
from shim.rpc.messages import Request, encode_request
from shim.rpc.status import Code

PODSHIM = [sys.executable, "-m", "shim"]
NAMESPACE = "fuzz"
FRAMES = 100_000


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def live_shim(tmp_path):
    """A started shim with a created and running sandbox; shut down (or deleted) afterwards."""
    sandbox_id = f"fz-{secrets.token_hex(4)}"
    runtime_root = f"/tmp/podshim-fz-{secrets.token_hex(4)}"
    bundle = str(tmp_path / sandbox_id)
    out = subprocess.run([*PODSHIM, "start", "--namespace", NAMESPACE, "--id", sandbox_id, "--bundle", bundle,
                          "--runtime-root", runtime_root], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    boot = json.loads(out.stdout)

    async def setup():
        async with await Client.connect(boot["address"], namespace=NAMESPACE) as c:
            await c.call(SANDBOX_SERVICE, "CreateSandbox", {"sandbox_id": sandbox_id})
            await c.call(SANDBOX_SERVICE, "StartSandbox", {"sandbox_id": sandbox_id})

    asyncio.run(setup())
    try:
        yield sandbox_id, boot
    finally:
        subprocess.run([*PODSHIM, "delete", "--namespace", NAMESPACE, "--id", sandbox_id, "--bundle", bundle,
                        "--runtime-root", runtime_root], capture_output=True, timeout=30)
        subprocess.run(["rm", "-rf", runtime_root])


def _frame(sid: int, mtype: int, flags: int, data: bytes, length: int | None = None) -> bytes:
    return HEADER.pack(len(data) if length is None else length, sid, mtype, flags) + data


def _bad_messages(rng: random.Random, sandbox_id: str):
    """Yield (data, expects_answer) pairs: request payloads that are malformed in every way we know."""
    long = "x" * rng.randint(77, 300)
    ids = ["../../etc/passwd", "..", "a/b", "", long, "a..b", "-a", "\x00", "é", 5, None, ["x"]]
    bundles = ["../../../../tmp/evil", "relative/path", "/proc/self/root", "\x00", 7]
    methods = [*("CreateSandbox", "StartSandbox", "StopSandbox", "WaitSandbox", "SandboxStatus",
                 "SandboxMetrics", "Platform", "PingSandbox"), "NoSuchMethod", "", "x" * 1000]
    while True:
        kind = rng.randrange(9)
        if kind == 0:  # random bytes
            yield bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        elif kind == 1:  # msgpack of the wrong shape
            yield msgpack.packb(rng.choice([1, "s", [1, 2], None, True, 3.5, {"service": 1}, {"method": []}]))
        elif kind == 2:  # unknown service / method
            yield encode_request(Request(rng.choice(["nope", SANDBOX_SERVICE, TASK_SERVICE]),
                                         rng.choice(methods) or "x", {"sandbox_id": sandbox_id}))
        elif kind == 3:  # invalid identifiers, path traversal
            yield encode_request(Request(SANDBOX_SERVICE, rng.choice(methods[:8]), {"sandbox_id": rng.choice(ids)}))
        elif kind == 4:  # traversal in the bundle path of a (second) CreateSandbox
            yield encode_request(Request(SANDBOX_SERVICE, "CreateSandbox",
                                         {"sandbox_id": sandbox_id, "bundle_path": rng.choice(bundles),
                                          "netns_path": rng.choice(["/etc/passwd", "../x", 3])}))
        elif kind == 5:  # wrong field types
            yield msgpack.packb({"service": SANDBOX_SERVICE, "method": "SandboxStatus",
                                 "payload": rng.choice([[], 1, "p"]), "timeout_nano": rng.choice([-1, "x", 1.5]),
                                 "metadata": rng.choice([[], {"k": 1}, "m"])})
        elif kind == 6:  # huge metadata
            yield msgpack.packb({"service": SANDBOX_SERVICE, "method": "PingSandbox",
                                 "payload": {"sandbox_id": sandbox_id},
                                 "metadata": {f"k{i}": ["v" * 100] * 4 for i in range(rng.randint(65, 300))}})
        elif kind == 7:  # options of the wrong shape
            yield encode_request(Request(SANDBOX_SERVICE, "CreateSandbox", {
                "sandbox_id": sandbox_id, "options": rng.choice([
                    {"linux": {"sysctls": {"kernel.pid_max": "1"}}}, {"hostname": "a" * 100},
                    {"linux": {"security_context": {"namespace_options": {"network": 9}}}},
                    {"linux": {"cgroup_parent": "../../.."}}, {"labels": {"a": 1}}, []])}))
        else:  # a truncated msgpack document
            good = encode_request(Request(SANDBOX_SERVICE, "PingSandbox", {"sandbox_id": sandbox_id}))
            yield good[:rng.randint(1, len(good) - 1)]


def _drain_responses(sock: socket.socket, conn: ClientConnection, want: int, timeout: float = 30.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < want:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        data = sock.recv(1 << 16)
        if not data:
            raise AssertionError(f"the shim closed the connection after {len(got)} of {want} answers")
        got += [ev for ev in conn.receive_data(data) if isinstance(ev, ResponseReceived)]
    return got


def _ping(address: str, sandbox_id: str) -> None:
    async def ping():
        async with await Client.connect(address, namespace=NAMESPACE) as c:
            await c.call(SANDBOX_SERVICE, "PingSandbox", {"sandbox_id": sandbox_id}, timeout=5)
    asyncio.run(ping())


@pytest.mark.slow
def test_shim_answers_100000_malformed_frames_and_keeps_serving(live_shim):
    sandbox_id, boot = live_shim
    path = boot["address"][len("unix://"):]
    rng = random.Random(20261129)
    bad = _bad_messages(rng, sandbox_id)
    rss_start = None
    sent = 0
    codes: dict[int, int] = {}
    batch = 500
    while sent < FRAMES:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        conn = ClientConnection()  # only to decode answers
        sid = 1
        out = []
        for _ in range(batch):
            out.append(_frame(sid, 1, 0, next(bad)))
            sid += 2
        # every 10th batch also carries framing errors that fail their own stream
        if (sent // batch) % 10 == 0:
            out.append(_frame(sid, 1, 0, b"\0" * 64, length=MAX_DATA_BYTES + 1) + b"\0" * (MAX_DATA_BYTES + 1 - 64))
            out.append(_frame(4, 1, 0, b"\x80"))             # even stream id
            out.append(_frame(1, 1, 0, b"\x80"))             # reused stream id
            out.append(_frame(sid + 2, 9, 0, b"ignored"))    # unknown type: no answer
            expected = batch + 3
        else:
            expected = batch
        sock.sendall(b"".join(out))
        answers = _drain_responses(sock, conn, expected)
        for a in answers:
            codes[a.response.code] = codes.get(a.response.code, 0) + 1
        sock.close()
        sent += expected
        if rss_start is None:
            rss_start = _rss_kib(boot["pid"])
        if (sent // batch) % 40 == 0:
            _ping(boot["address"], sandbox_id)
    # connections that end in an unrecoverable framing error: closed, and only they
    for trailer in (_frame(1, 1, 0, b"", length=1 << 24), _frame(1, 1, 0, b"\x81\xa1")[:-1]):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        sock.sendall(trailer)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(10)
        assert sock.recv(100) == b""
        sock.close()
    _ping(boot["address"], sandbox_id)
    assert sum(codes.values()) >= FRAMES
    assert codes.get(Code.OK, 0) < sum(codes.values()) // 2  # nearly everything was refused
    assert {Code.INVALID_ARGUMENT, Code.UNIMPLEMENTED, Code.RESOURCE_EXHAUSTED} <= set(codes)
    growth = _rss_kib(boot["pid"]) - rss_start
    assert growth < 16 * 1024, f"the shim's RSS grew by {growth} KiB"


def as_nobody(action) -> bytes:
    """Run ``action()`` in a forked child that became uid/gid 65534; return the bytes it returned."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, action())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    try:
        return os.read(r, 64)
    finally:
        os.close(r)


def test_shim_refuses_a_client_with_another_uid(live_shim) -> None:
    sandbox_id, boot = live_shim
    path = boot["address"][len("unix://"):]
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700

    def connect() -> bytes:  # another user cannot even reach the socket: the 0700 dir stops it
        try:
            socket.socket(socket.AF_UNIX).connect(path)
            return b"connected"
        except PermissionError:
            return b"denied"

    assert as_nobody(connect) == b"denied"


def test_shim_closes_a_peer_whose_uid_is_not_allowed(live_shim) -> None:
    """Past the file permissions (a second, world-connectable name for the socket), the server's
    own SO_PEERCRED check closes a connection from another uid without answering."""
    sandbox_id, boot = live_shim
    path = boot["address"][len("unix://"):]
    link_dir = f"/tmp/podshim-fz-link-{secrets.token_hex(4)}"
    os.mkdir(link_dir, 0o755)
    link = os.path.join(link_dir, "s")
    os.link(path, link)  # a second name for the same socket inode, in a directory nobody can enter
    os.chmod(link, 0o777)  # the inode's mode: nobody may connect; only SO_PEERCRED can refuse now

    def ping() -> bytes:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(link)
        _, frame = ClientConnection().request(Request(SANDBOX_SERVICE, "PingSandbox", {"sandbox_id": sandbox_id}))
        try:
            s.sendall(frame)
            data = s.recv(100)
        except OSError:
            data = b""
        return b"closed" if data == b"" else b"answered"

    try:
        assert as_nobody(ping) == b"closed"
    finally:
        os.chmod(path, 0o600)
        os.unlink(link)
        os.rmdir(link_dir)
    _ping(boot["address"], sandbox_id)


@pytest.mark.slow
def test_100_clients_times_1000_calls_without_an_error(live_shim) -> None:
    sandbox_id, boot = live_shim
    latencies: list[float] = []

    async def client_loop():
        async with await Client.connect(boot["address"], namespace=NAMESPACE) as c:
            for _ in range(1000):
                began = time.perf_counter()
                await c.call(SANDBOX_SERVICE, "PingSandbox", {"sandbox_id": sandbox_id}, timeout=30)
                latencies.append(time.perf_counter() - began)

    async def all_clients():
        await asyncio.gather(*(client_loop() for _ in range(100)))

    asyncio.run(all_clients())
    assert len(latencies) == 100_000
    latencies.sort()
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    print(f"\n100 clients x 1000 PingSandbox: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")
