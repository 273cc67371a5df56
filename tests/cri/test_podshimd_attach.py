"""Attach through podshimd's streaming server, driven by the real crictl 1.26 (`crictl attach`): the running
container's output as it comes, to several attachers; its stdin kept open through the shim (stdin_once:
closed by the first attacher's end of input); detaching leaves the container running."""

from __future__ import annotations

import json
import select
import subprocess

import grpc
import pytest

from client.criapi import api_pb2
from podtools import container_config, pod_config

#: Bound on waiting for one line of an attacher's output.
LINE_WAIT = 30.0


@pytest.fixture
def start(daemon, crictl, tmp_path):
    """start(command, **config) -> the id of a running container in a fresh pod."""
    pod_path = tmp_path / "pod.json"
    pod_path.write_text(json.dumps(pod_config()))
    pod_id = daemon.crictl(crictl, "runp", str(pod_path)).stdout.strip()

    def start(command: list[str], **extra) -> str:
        ctr_path = tmp_path / "ctr.json"
        ctr_path.write_text(json.dumps({**container_config(command), **extra}))
        container_id = daemon.crictl(crictl, "create", pod_id, str(ctr_path), str(pod_path)).stdout.strip()
        daemon.crictl(crictl, "start", container_id)
        return container_id
    return start


def state(daemon, crictl, container_id: str) -> str:
    return json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["status"]["state"]


def attach(daemon, crictl, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([crictl, "--runtime-endpoint", daemon.endpoint, "attach", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_attach_i_feeds_stdin_once_and_ends_when_the_container_exits(daemon, crictl, start):
    container_id = start(["sh", "-c", "read first; echo got $first; cat; echo bye >&2"], stdin=True,
                         stdin_once=True)
    proc = attach(daemon, crictl, "-i", container_id, stdin=subprocess.PIPE)
    out, err = proc.communicate(b"hello\nrest of it\n", timeout=60)
    assert proc.returncode == 0, err
    assert out == b"got hello\nrest of it\n" and err.endswith(b"bye\n")
    assert state(daemon, crictl, container_id) == "CONTAINER_EXITED"


def read_line(proc: subprocess.Popen) -> bytes:
    """The attacher's next line of output (bounded: a missing line fails, never hangs the run)."""
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


def test_attach_with_stdin_to_a_container_without_stdin_is_refused(daemon, crictl, start):
    container_id = start(["sleep", "600"])
    with pytest.raises(grpc.RpcError) as failed:
        daemon.runtime().Attach(api_pb2.AttachRequest(container_id=container_id, stdin=True, stdout=True))
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "has no stdin to attach to" in failed.value.details()


def test_a_tty_container_is_refused_at_create_with_a_sentence(daemon, crictl, tmp_path):
    pod_path, ctr_path = tmp_path / "pod.json", tmp_path / "ctr.json"
    pod_path.write_text(json.dumps(pod_config()))
    ctr_path.write_text(json.dumps({**container_config(["sh"]), "stdin": True, "tty": True}))
    pod_id = daemon.crictl(crictl, "runp", str(pod_path)).stdout.strip()
    created = daemon.crictl(crictl, "create", pod_id, str(ctr_path), str(pod_path), check=False)
    assert created.returncode != 0
    assert "InvalidArgument" in created.stderr and "tty containers are not supported yet" in created.stderr
    assert daemon.crictl(crictl, "ps", "-a", "-q").stdout.strip() == ""
