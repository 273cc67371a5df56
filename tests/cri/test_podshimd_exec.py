"""Exec through podshimd's streaming server, driven by the real crictl: `crictl exec` (output and exit
code), `crictl exec -i` with stdin piped, `crictl exec -it` on a terminal (script(1)) with a resize; the
command killed when the client goes away. And exec over a WebSocket, as kubelet proxies one (its
channels, the error channel's status, stdin to v5's close signal), with a client of our own codec."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import socket
import struct
import subprocess

import grpc
import pytest

from shim.cri.api import api_pb2
from shim.rpc.frames import NEED_DATA

from client.streaming import websocket

from support.podtools import container_config, pod_config
from support.proctools import wait_gone
from support.shimtools import HANDLERS

MB = 1 << 20


def sleeping_container(daemon, crictl, tmp_path, *runp_options: str) -> str:
    """The id of a running container (sleep) in a ready pod made by ``crictl runp RUNP_OPTIONS``."""
    pod_path = tmp_path / "pod.json"
    pod_path.write_text(json.dumps(pod_config()))
    pod_id = daemon.crictl(crictl, "runp", *runp_options, str(pod_path)).stdout.strip()
    container_id = daemon.create_container(pod_id, container_config(["sleep", "600"]), str(pod_path))
    daemon.crictl(crictl, "start", container_id)
    return container_id


@pytest.fixture
def container(daemon, crictl, tmp_path) -> str:
    """A running container (sleep) in a ready pod."""
    return sleeping_container(daemon, crictl, tmp_path)


def crictl_exec(daemon, crictl, *args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([crictl, "--runtime-endpoint", daemon.endpoint, "exec", *args],
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, timeout=timeout)


def test_exec_streams_stdout_and_stderr_and_succeeds(daemon, crictl, container) -> None:
    done = crictl_exec(daemon, crictl, container, "sh", "-c", "echo out; echo err >&2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"out\n" and done.stderr == b"err\n"


def test_exec_reports_the_commands_exit_code(daemon, crictl, container) -> None:
    done = crictl_exec(daemon, crictl, container, "sh", "-c", "exit 7")
    # crictl turns any failure into its own exit status 1, quoting the error.
    assert done.returncode == 1 and b"command terminated with exit code 7" in done.stderr, done.stderr


def test_exec_runs_in_the_containers_namespaces(daemon, crictl, container) -> None:
    info = json.loads(daemon.crictl(crictl, "inspect", container).stdout)["info"]
    done = crictl_exec(daemon, crictl, container, "sh", "-c", "readlink /proc/self/ns/pid; readlink /proc/self/ns/net")
    with open(f"/proc/{info['pid']}/ns/pid", "rb"):
        pass
    assert done.stdout.decode().split() == [os.readlink(f"/proc/{info['pid']}/ns/pid"),
                                            os.readlink(f"/proc/{info['pid']}/ns/net")]


def test_exec_i_carries_piped_stdin_to_the_end(daemon, crictl, container) -> None:
    payload = os.urandom(3 * MB)
    done = crictl_exec(daemon, crictl, "-i", container, "sha256sum", stdin=payload)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0].decode() == hashlib.sha256(payload).hexdigest()


def test_exec_of_a_program_that_does_not_exist_is_a_clear_error(daemon, crictl, container) -> None:
    done = crictl_exec(daemon, crictl, container, "/no/such/program")
    assert done.returncode != 0
    assert b"exec /no/such/program: No such file or directory" in done.stderr


@pytest.fixture(params=HANDLERS)
def handler_container(request, daemon, crictl, tmp_path) -> str:
    """A running container (sleep) in a ready pod of each runtime handler."""
    return sleeping_container(daemon, crictl, tmp_path, "--runtime", request.param)


def test_exec_it_runs_on_a_terminal_and_follows_its_size(daemon, crictl, handler_container) -> None:
    # script(1) gives crictl a terminal of 40 rows by 100 columns; the command sees the same from its
    # start (the server hands crictl's first size to ExecStart: the terminal is made at that size), on
    # a terminal of the container's own /dev/pts (made by the runtime: runc's and crun's console socket).
    command = (f"{crictl} --runtime-endpoint {daemon.endpoint} exec -it {handler_container} "
               "sh -c 'tty; stty size; read -r _ _ _ _ _ _ tty_nr _ < /proc/self/stat; echo $tty_nr'")
    done = subprocess.run(["script", "-qec", f"stty rows 40 cols 100; {command}", "/dev/null"],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # (script(1) passes on the NUL bytes crictl's terminal handling writes; a terminal may echo them as "^@")
    lines = done.stdout.decode().replace("\r", "").replace("\0", "").replace("^@", "").split("\n")
    assert re.fullmatch(r"/dev/pts/\d+", lines[0]), lines  # the container's own devpts names it
    assert lines[1] == "40 100", lines
    assert int(lines[2]) != 0, lines  # the command's controlling terminal


def test_exec_it_leaves_no_fd_open_in_podshimd(daemon, crictl, handler_container) -> None:
    def exec_it() -> None:
        command = f"{crictl} --runtime-endpoint {daemon.endpoint} exec -it {handler_container} true"
        done = subprocess.run(["script", "-qec", command, "/dev/null"], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=60)
        assert done.returncode == 0, done.stdout

    exec_it()  # podshimd's own lazily opened files
    fd_dir = f"/proc/{daemon.process.pid}/fd"
    before = sorted(os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir))
    for _ in range(3):
        exec_it()
    after = sorted(os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir))
    assert not [fd for fd in after if "ptmx" in fd or "pts" in fd or "console" in fd]
    assert len(after) == len(before), (before, after)


def test_the_command_is_killed_when_the_client_goes_away(daemon, crictl, container):
    proc = subprocess.Popen([crictl, "--runtime-endpoint", daemon.endpoint, "exec", container, "sh", "-c",
                             "echo $$; exec sleep 600"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        inner = int(proc.stdout.readline())  # pid in the container's pid namespace
        found = [pid for pid in _container_pids(daemon, crictl, container) if _ns_pid(pid) == inner]
        assert len(found) == 1
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert not wait_gone(found[0], timeout=30)


def _container_pids(daemon, crictl, container_id: str) -> list[int]:
    info = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["info"]
    with open(f"/proc/{info['pid']}/cgroup") as f:
        path = next(line.split(":", 2)[2].strip() for line in f if line.split(":")[1] in ("", "pids"))
    for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        procs = f"{root}{path}/cgroup.procs"
        if os.path.exists(procs):
            with open(procs) as f:
                return [int(line) for line in f]
    raise AssertionError(f"no cgroup.procs for {path}")


def _ns_pid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("NSpid:")).split()[-1])


def test_exec_in_a_container_that_does_not_run_is_refused(daemon) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        daemon.runtime().Exec(api_pb2.ExecRequest(container_id="f" * 64, cmd=["true"], stdout=True))
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND


def test_exec_with_tty_and_stderr_is_invalid(daemon, container) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        daemon.runtime().Exec(api_pb2.ExecRequest(container_id=container, cmd=["true"], tty=True, stderr=True))
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_container_that_stops_mid_exec_ends_the_exec_with_its_killed_status(daemon, crictl, container):
    proc = subprocess.Popen([crictl, "--runtime-endpoint", daemon.endpoint, "exec", container, "sh", "-c",
                             "echo started; exec sleep 600"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"started\n"
        daemon.crictl(crictl, "stop", "-t", "0", container)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The container's pid namespace went with it: the exec was killed (SIGKILL: 128 + 9).
    assert proc.returncode == 1 and b"command terminated with exit code 137" in err, err


# -- exec over a WebSocket, as kubelet proxies its client's (Kubernetes' channel.k8s.io protocols) ------

def websocket_exec(url: str, protocol: str, stdin: bytes = b"", close_stdin: bool = False,
                   timeout: float = 60) -> tuple[list[tuple[int, bytes]], bytes]:
    """Open ``url`` (an Exec answer's) as a WebSocket speaking ``protocol``, send ``stdin`` on channel 0
    (then v5's close signal for it when ``close_stdin``), and read until the server closes: every
    message as (channel, data), and the close frame's payload."""
    host_port, path = url.removeprefix("http://").split("/", 1)
    host, port = host_port.rsplit(":", 1)
    key = base64.b64encode(os.urandom(16)).decode()
    text = protocol.startswith(("base64.", "v4.base64."))
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                     f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n"
                     f"Sec-WebSocket-Protocol: {protocol}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            assert chunk, head
            head += chunk
        head, _, rest = head.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 "), head
        assert f"Sec-WebSocket-Accept: {websocket.accept_key(key)}".encode() in head, head
        assert f"Sec-WebSocket-Protocol: {protocol}".encode() in head, head
        for offset in range(0, len(stdin), 32 * 1024):
            piece = stdin[offset:offset + 32 * 1024]
            message = b"0" + base64.b64encode(piece) if text else b"\x00" + piece
            sock.sendall(websocket.encode_frame(0x1 if text else 0x2, message, mask=os.urandom(4)))
        if close_stdin:
            sock.sendall(websocket.encode_frame(0x2, bytes([255, 0]), mask=os.urandom(4)))
        frames = websocket.FrameReader(client_side=True, max_bytes=64 * MB)
        frames.feed(rest)
        messages: list[tuple[int, bytes]] = []
        while True:
            while (event := frames.next_message()) is not NEED_DATA:
                assert isinstance(event, tuple)  # (a message: NEED_DATA is the only other answer)
                opcode, payload = event
                if opcode == 0x8:
                    return messages, payload
                if text:
                    messages.append((int(payload[:1]), base64.b64decode(payload[1:])))
                else:
                    messages.append((payload[0], payload[1:]))
            chunk = sock.recv(65536)
            assert chunk, f"the connection ended without a close frame after {messages}"
            frames.feed(chunk)


def channel(messages: list[tuple[int, bytes]], number: int) -> bytes:
    return b"".join(data for n, data in messages if n == number)


@pytest.mark.parametrize("protocol", ["channel.k8s.io", "base64.channel.k8s.io"])
def test_exec_over_a_websocket_streams_stdout_and_stderr_on_their_channels_and_closes(daemon, container, protocol) -> None:
    url = daemon.runtime().Exec(api_pb2.ExecRequest(container_id=container, cmd=["sh", "-c", "echo out; echo err >&2"],
                                                     stdout=True, stderr=True)).url
    messages, close = websocket_exec(url, protocol)
    assert messages[0] == (1, b"")  # the first message: empty, on stdout, as kubelet's server opens
    assert channel(messages, 1) == b"out\n" and channel(messages, 2) == b"err\n"
    assert channel(messages, 3) == b""  # v1: success says nothing
    assert close == struct.pack("!H", 1000)


def test_exec_over_a_v4_websocket_reports_the_exit_code_as_a_status_on_the_error_channel(daemon, container) -> None:
    url = daemon.runtime().Exec(api_pb2.ExecRequest(container_id=container, cmd=["sh", "-c", "exit 7"],
                                                     stdout=True)).url
    messages, _ = websocket_exec(url, "v4.channel.k8s.io")
    status = json.loads(channel(messages, 3))
    assert (status["status"], status["reason"]) == ("Failure", "NonZeroExitCode")
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "7"}]


def test_exec_over_a_v5_websocket_carries_stdin_to_its_close_signal(daemon, container) -> None:
    payload = os.urandom(MB)
    url = daemon.runtime().Exec(api_pb2.ExecRequest(container_id=container, cmd=["sha256sum"], stdin=True,
                                                     stdout=True)).url
    messages, _ = websocket_exec(url, "v5.channel.k8s.io", stdin=payload, close_stdin=True)
    assert channel(messages, 1).split()[0].decode() == hashlib.sha256(payload).hexdigest()
    assert json.loads(channel(messages, 3))["status"] == "Success"
