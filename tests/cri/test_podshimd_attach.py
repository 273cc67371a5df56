"""Attach through podshimd's streaming server, driven by the real crictl (`crictl attach`): the running
container's output as it comes, to several attachers; its stdin kept open through the shim (stdin_once:
closed by the first attacher's end of input); detaching leaves the container running. A tty container:
`crictl attach -it` on a terminal gets the container's terminal, follows the client's size, with several
attachers at once; its output is logged as stdout."""

from __future__ import annotations

import json
import re
import select
import subprocess

import grpc
import pytest

from shim.cri.api import api_pb2

from support.critools import HOST_PYTHON_MOUNTS
from support.podtools import container_config, pod_config
from support.shimtools import HANDLERS
from support.ttytools import OnTerminal

#: Bound on waiting for one line of an attacher's output.
LINE_WAIT = 30.0


@pytest.fixture
def start(daemon, crictl, tmp_path):
    """start(command, handler="native", **config) -> the id of a running container in a fresh pod of that
    runtime handler."""
    pod_path = tmp_path / "pod.json"
    pod_path.write_text(json.dumps(pod_config()))
    pods: dict[str, str] = {}

    def start(command: list[str], handler: str = "native", **extra) -> str:
        if handler not in pods:
            pods[handler] = daemon.crictl(crictl, "runp", "--runtime", handler, str(pod_path)).stdout.strip()
        container_id = daemon.create_container(pods[handler], {**container_config(command), **extra}, str(pod_path))
        daemon.crictl(crictl, "start", container_id)
        return container_id
    return start


def state(daemon, crictl, container_id: str) -> str:
    return json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["status"]["state"]


def attach(daemon, crictl, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([crictl, "--runtime-endpoint", daemon.endpoint, "attach", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_attach_i_feeds_stdin_once_and_ends_when_the_container_exits(daemon, crictl, start) -> None:
    container_id = start(["sh", "-c", "read first; echo got $first; cat; echo bye >&2"], stdin=True,
                         stdin_once=True)
    proc = attach(daemon, crictl, "-i", container_id, stdin=subprocess.PIPE)
    out, err = proc.communicate(b"hello\nrest of it\n", timeout=60)
    assert proc.returncode == 0, err
    assert out == b"got hello\nrest of it\n" and err.endswith(b"bye\n")
    assert state(daemon, crictl, container_id) == "CONTAINER_EXITED"


def read_line(proc: subprocess.Popen) -> bytes:
    """The attacher's next line of output (bounded: a missing line fails, never hangs the run)."""
    assert proc.stdout is not None  # (PIPE)
    ready, _, _ = select.select([proc.stdout], [], [], LINE_WAIT)
    assert ready, f"no output from crictl attach within {LINE_WAIT} s"
    return proc.stdout.readline()


def test_several_attachers_see_the_same_output_and_detaching_leaves_the_container_running(daemon, crictl, start):
    container_id = start(["sh", "-c", "while read line; do echo got $line; done"], stdin=True)
    first = attach(daemon, crictl, "-i", container_id, stdin=subprocess.PIPE)
    second = None
    try:
        first.stdin.write(b"one\n")
        first.stdin.flush()
        assert read_line(first) == b"got one\n"  # the first is attached
        second = attach(daemon, crictl, "-i", container_id, stdin=subprocess.PIPE)
        second.stdin.write(b"two\n")
        second.stdin.flush()
        assert read_line(second) == b"got two\n"
        assert read_line(first) == b"got two\n"
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.communicate()
    assert state(daemon, crictl, container_id) == "CONTAINER_RUNNING"


def test_attach_with_stdin_to_a_container_without_stdin_is_refused(daemon, crictl, start) -> None:
    container_id = start(["sleep", "600"])
    with pytest.raises(grpc.RpcError) as failed:
        daemon.runtime().Attach(api_pb2.AttachRequest(container_id=container_id, stdin=True, stdout=True))
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "has no stdin to attach to" in failed.value.details()


#: A tty container's program: on each line it reads, its terminal and the line; on SIGWINCH, its size.
#: (os.write, not print: a handler that prints while the loop prints fails with a reentrant call.)
TTY_PROGRAM = """
import os, signal, sys
signal.signal(signal.SIGWINCH, lambda *_: os.write(1, b"size %d %d\\n" % os.get_terminal_size()[::-1]))
for line in sys.stdin:
    os.write(1, b"got %s on %s\\n" % (line.strip().encode(), os.ttyname(0).encode()))
"""


def crictl_on_terminal(daemon, crictl, container_id: str, rows: int, cols: int) -> OnTerminal:
    """``crictl attach -it`` on a pseudo-terminal the test holds the master of."""
    return OnTerminal([crictl, "--runtime-endpoint", daemon.endpoint, "attach", "-it", container_id], rows, cols)


@pytest.mark.parametrize("handler", HANDLERS)
def test_attach_it_gets_the_containers_terminal_its_size_and_resizes(daemon, crictl, start, handler) -> None:
    container_id = start(["python3", "-c", TTY_PROGRAM], handler, stdin=True, tty=True, mounts=HOST_PYTHON_MOUNTS)
    first = crictl_on_terminal(daemon, crictl, container_id, rows=40, cols=100)
    second = None
    try:
        first.type(b"hello\n")
        tty = first.read_until(rb"got hello on (/dev/pts/\d+)").group(1)
        first.resize(50, 120)  # crictl sends the new size; the container's terminal takes it and says so
        first.read_until(rb"size 50 120")
        # A second attacher at once: both see what either one types.
        second = crictl_on_terminal(daemon, crictl, container_id, rows=50, cols=120)
        second.type(b"two\n")
        second.read_until(rb"got two on " + re.escape(tty))
        first.read_until(rb"got two on " + re.escape(tty))
        second.proc.kill()  # a client that goes away mid-attach: the others and the container go on
        second.close()
        second = None
        first.type(b"three\n")
        first.read_until(rb"got three")
    finally:
        for attacher in (first, second):
            if attacher is not None:
                attacher.close()
    # Detached: the container runs on; its terminal's output is its log, as stdout.
    assert state(daemon, crictl, container_id) == "CONTAINER_RUNNING"
    logs = daemon.crictl(crictl, "logs", container_id)
    assert "got hello on /dev/pts/" in logs.stdout and "size 50 120" in logs.stdout and logs.stderr == ""
    listed = json.loads(daemon.crictl(crictl, "ps", "-o", "json").stdout)["containers"]
    assert [c["state"] for c in listed if c["id"] == container_id] == ["CONTAINER_RUNNING"]


def test_a_tty_containers_output_is_logged_as_stdout_and_stdin_once_ends_its_input(daemon, crictl, start) -> None:
    container_id = start(["sh", "-c", "tty; echo to-stderr >&2; cat; echo after-eof"], stdin=True,
                         stdin_once=True, tty=True)
    proc = attach(daemon, crictl, "-i", container_id, stdin=subprocess.PIPE)
    out, err = proc.communicate(b"typed\n", timeout=60)  # its end: the terminal's end-of-file
    assert proc.returncode == 0, err
    assert b"typed\r\n" in out and out.endswith(b"after-eof\r\n")
    assert state(daemon, crictl, container_id) == "CONTAINER_EXITED"
    logs = daemon.crictl(crictl, "logs", container_id)
    lines = logs.stdout.splitlines()
    assert lines[0].startswith("/dev/pts/") and "to-stderr" in lines and lines[-1] == "after-eof", lines
    assert logs.stderr == ""
