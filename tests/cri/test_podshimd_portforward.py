"""PortForward through podshimd's streaming server, driven by the real crictl (`crictl port-forward`):
TCP connections into the pod's network namespace, both ways, several at once, errors on the error stream."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from shim.cri.api import api_pb2
from shim.launch.template import stop_template

from support.critools import podshimd_argv, running_podshimd
from support.podtools import pod_config

MB = 1 << 20

# A server run inside the pod's netns: for each connection, reads until the client half-closes,
# answers "<sha256 of what it read> <bytes read>\n" followed by COUNT bytes of a pattern, then closes.
POD_SERVER = r"""
import hashlib, socket, sys, threading
count = int(sys.argv[1])
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print(listener.getsockname()[1], flush=True)
def serve(conn):
    digest, total = hashlib.sha256(), 0
    while chunk := conn.recv(65536):
        digest.update(chunk); total += len(chunk)
    conn.sendall(f"{digest.hexdigest()} {total}\n".encode())
    block = bytes(range(256)) * 256
    sent = 0
    while sent < count:
        sent += conn.send(block[:min(len(block), count - sent)])
    conn.close()
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def pattern(count: int) -> bytes:
    block = bytes(range(256)) * 256
    return (block * (count // len(block) + 1))[:count]


def runp(daemon, crictl, tmp_path, config: dict) -> str:
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(config))
    return daemon.crictl(crictl, "runp", str(path)).stdout.strip()


@pytest.fixture
def pod(daemon, crictl, tmp_path) -> str:
    return runp(daemon, crictl, tmp_path, pod_config())


def netns_of(daemon, crictl, pod_id: str) -> str:
    return json.loads(daemon.crictl(crictl, "inspectp", pod_id).stdout)["info"]["netns_path"]


@contextmanager
def pod_server(netns: str | None, count: int) -> Iterator[int]:
    """The checksum server in ``netns`` (None: the host's); yields its port; killed by pid after."""
    argv = [sys.executable, "-c", POD_SERVER, str(count)]
    if netns:
        argv = ["nsenter", f"--net={netns}", "--", *argv]
    server = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None  # (PIPE)
    try:
        yield int(server.stdout.readline())
    finally:
        server.kill()
        server.wait()
        server.stdout.close()


@contextmanager
def port_forward(daemon, crictl, pod_id: str, remote_port: int) -> Iterator[tuple[int, subprocess.Popen]]:
    """``crictl port-forward POD :REMOTE``; yields the local port it listens on; ended by pid after."""
    proc = subprocess.Popen([crictl, "--runtime-endpoint", daemon.endpoint, "port-forward", pod_id,
                             f"0:{remote_port}"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None  # (PIPE)
    try:
        line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> REMOTE"
        found = re.search(r"127\.0\.0\.1:(\d+) ->", line)
        assert found, f"crictl port-forward said {line!r}, {proc.stderr.read() if proc.poll() is not None else ''}"
        yield int(found.group(1)), proc
    finally:
        proc.terminate()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def exchange(port: int, payload: bytes) -> tuple[bytes, bytes]:
    """Send ``payload``, half-close, read to the end: (the server's status line, the bytes after it)."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        received = bytearray()
        def send() -> None:
            conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        while chunk := conn.recv(1 << 16):
            received += chunk
        sender.join()
    line, _, rest = bytes(received).partition(b"\n")
    return line, rest


def test_port_forward_carries_10_mb_each_way_checksummed(daemon, crictl, pod) -> None:
    payload = os.urandom(10 * MB)
    with pod_server(netns_of(daemon, crictl, pod), 10 * MB) as remote, \
            port_forward(daemon, crictl, pod, remote) as (local, _):
        line, rest = exchange(local, payload)
    assert line.decode() == f"{hashlib.sha256(payload).hexdigest()} {len(payload)}"
    assert hashlib.sha256(rest).digest() == hashlib.sha256(pattern(10 * MB)).digest()


def test_port_forward_reaches_the_pods_namespace_not_the_hosts(daemon, crictl, pod) -> None:
    # A server on the host's loopback at the same port is not what the pod's port-forward reaches.
    with pod_server(None, 0) as host_port, port_forward(daemon, crictl, pod, host_port) as (local, proc):
        with socket.create_connection(("127.0.0.1", local)) as conn:
            conn.shutdown(socket.SHUT_WR)
            assert conn.recv(100) == b""  # the pod has nothing there: closed without an answer
        message = read_until(proc.stderr, "An error occurred forwarding")
    assert f"cannot connect to port {host_port} on the pod's localhost: Connection refused" in message


def test_several_connections_at_once(daemon, crictl, pod) -> None:
    payloads = [os.urandom(512 * 1024 + i) for i in range(6)]
    results: list = [None] * len(payloads)
    with pod_server(netns_of(daemon, crictl, pod), 1000) as remote, \
            port_forward(daemon, crictl, pod, remote) as (local, _):
        def run(i: int) -> None:
            results[i] = exchange(local, payloads[i])
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(payloads))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for payload, (line, rest) in zip(payloads, results, strict=False):
        assert line.decode() == f"{hashlib.sha256(payload).hexdigest()} {len(payload)}"
        assert rest == pattern(1000)


def test_port_forward_to_a_host_network_pod_reaches_the_hosts_loopback(daemon, crictl, tmp_path) -> None:
    config = pod_config(network=2)
    del config["linux"]["sysctls"]  # network sysctls would change the host's network: refused
    pod_id = runp(daemon, crictl, tmp_path, config)
    with pod_server(None, 100) as remote, port_forward(daemon, crictl, pod_id, remote) as (local, _):
        line, rest = exchange(local, b"hello")
    assert line.decode() == f"{hashlib.sha256(b'hello').hexdigest()} 5" and rest == pattern(100)


def read_until(stream, needle: str) -> str:
    """The first line of ``stream`` containing ``needle`` (crictl logs an error of one connection, then
    ends the session: "lost connection to pod")."""
    seen = []
    while line := stream.readline():
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"{needle!r} never came: {''.join(seen)}")


def test_nothing_listening_is_a_clear_error_and_the_server_goes_on(daemon, crictl, pod) -> None:
    netns = netns_of(daemon, crictl, pod)
    with pod_server(netns, 10) as remote:
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        unused = remote + 1 if remote < 65535 else remote - 1
        closed.close()
        with port_forward(daemon, crictl, pod, unused) as (local, proc):
            with socket.create_connection(("127.0.0.1", local)) as conn:
                conn.shutdown(socket.SHUT_WR)
                assert conn.recv(100) == b""
            assert "Connection refused" in read_until(proc.stderr, "An error occurred forwarding")
        with port_forward(daemon, crictl, pod, remote) as (local, _):  # a new session works
            line, rest = exchange(local, b"again")
        assert line.decode().endswith(" 5") and rest == pattern(10)


# -- the URL and its token ---------------------------------------------------------------------------

def portforward_url(daemon, pod_id: str) -> str:
    return daemon.runtime().PortForward(api_pb2.PortForwardRequest(pod_sandbox_id=pod_id, port=[80])).url


def upgrade(url: str, protocol: str = "portforward.k8s.io") -> tuple[int, str]:
    """POST an upgrade to ``url`` as the Go client does; (status, body) of the answer (body "" for 101)."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: Upgrade\r\n"
                     f"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {protocol}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(4096)
            assert chunk, f"the server closed after {answer!r}"
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1])
        if status != 101:
            found = re.search(rb"Content-Length: (\d+)", head)
            assert found, f"no Content-Length in {head!r}"
            length = int(found.group(1))
            while len(body) < length:
                body += conn.recv(4096)
            return status, body.decode()
        return status, ""


def test_port_forward_url_is_on_loopback_with_a_token(daemon, crictl, pod) -> None:
    url = portforward_url(daemon, pod)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/portforward/[A-Za-z0-9_-]{24}", url), url


def test_a_token_is_good_for_one_connection_only(daemon, crictl, pod) -> None:
    url = portforward_url(daemon, pod)
    assert upgrade(url) == (101, "")
    status, body = upgrade(url)
    assert status == 404 and "unknown, already used, or expired" in body


def test_a_bad_token_or_path_is_a_clear_http_error(daemon, crictl, pod) -> None:
    url = portforward_url(daemon, pod)
    base = url.rsplit("/", 2)[0]
    assert upgrade(base + "/portforward/nosuchtoken")[0] == 404
    status, body = upgrade(base + "/nowhere/x")
    assert status == 404 and "no such streaming endpoint" in body
    status, body = upgrade(url, protocol="v4.channel.k8s.io")
    assert status == 403 and "unable to negotiate protocol" in body
    assert upgrade(url)[0] == 101  # a refused negotiation does not spend the token


def test_port_forward_to_an_unknown_pod_is_not_found(daemon) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        portforward_url(daemon, "f" * 64)
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND



# -- the listener ------------------------------------------------------------------------------------

def test_the_streaming_server_listens_on_the_configured_address() -> None:
    directory = tempfile.mkdtemp(prefix="psd-str-")
    try:
        with running_podshimd(directory, config='streaming_address = "127.0.0.2:0"\n') as daemon:
            found = re.search(r"streaming \(exec, attach, port-forward\) on http://127\.0\.0\.2:(\d+)", daemon.log())
            assert found, daemon.log()
            socket.create_connection(("127.0.0.2", int(found.group(1)))).close()
    finally:
        shutil.rmtree(directory)


def test_a_streaming_address_in_use_stops_podshimd_with_a_sentence() -> None:
    directory = tempfile.mkdtemp(prefix="psd-str-")
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with open(os.path.join(directory, "config.toml"), "w") as f:
            f.write(f'streaming_address = "127.0.0.1:{port}"\n')
        result = subprocess.run(podshimd_argv(directory), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode != 0
        assert f"cannot serve streaming on 127.0.0.1:{port}: Address already in use" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        taken.close()
        stop_template(os.path.join(directory, "run"))
        shutil.rmtree(directory)
