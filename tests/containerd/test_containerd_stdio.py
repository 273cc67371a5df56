"""stdin and terminals through containerd's CRI on podshim pods, driven by the real crictl: ``exec -i``
(its stdin to the end), ``exec -it`` on a terminal the test holds (the exec's own terminal, its size
and resizes), ``attach -i`` to a container with stdin (stdin_once: its end ends the container's input)
and ``attach -it`` to a container with a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from support.ctrdtools import pod_config, sleeping_pod
from support.ttytools import OnTerminal

#: Bound on containerd's seeing a container exit.
SETTLE = 30.0


@pytest.fixture
def crictl_argv(containerd, crictl, ctrd_netns):
    """crictl_argv(*args): crictl's command line, run in containerd's network namespace (where its
    streaming server listens, on 127.0.0.1)."""
    def argv(*args: str) -> list[str]:
        return ["nsenter", f"--net={ctrd_netns}", "--", crictl, "--runtime-endpoint", containerd.endpoint,
                "--image-endpoint", containerd.endpoint, "--timeout", "30s", *args]
    return argv


def test_exec_i_gets_its_stdin_to_the_end(containerd, crictl, directory, test_images, crictl_argv) -> None:
    _, cid = sleeping_pod(containerd, crictl, directory, test_images.busybox.ref, "in")
    done = subprocess.run(crictl_argv("exec", "-i", cid, "sh", "-c", "read a; echo got $a; cat"),
                          input=b"hello\nthe rest\n", capture_output=True, timeout=60)
    assert done.returncode == 0, f"{done.stderr!r}\n{containerd.log()[-6000:]}"
    assert done.stdout == b"got hello\nthe rest\n"


def test_exec_it_runs_on_a_terminal_of_its_own_that_follows_crictls_size(containerd, crictl, directory, test_images, crictl_argv) -> None:
    _, cid = sleeping_pod(containerd, crictl, directory, test_images.busybox.ref, "tty")
    term = OnTerminal(crictl_argv("exec", "-it", cid, "sh"), rows=40, cols=100)
    try:
        term.type(b"tty; stty size; echo done-$((6*7))\n")
        found = term.read_until(rb"(/dev/pts/\d+)\s+40 100\s+done-42")
        assert found.group(1).startswith(b"/dev/pts/")
        term.resize(50, 120)  # crictl sends the new size: containerd's ResizePty on the exec
        term.type(b"sleep 0.5; stty size\n")
        term.read_until(rb"50 120")
        term.type(b"exit 3\n")
        assert term.wait() == 1, term.output  # (crictl exits 1 when a streamed command fails)
    finally:
        term.close()


def started_container(containerd, crictl: str, directory: str, image: str, command: list[str],
                      **config: object) -> str:
    assert containerd.crictl(crictl, "pull", image, timeout=120).returncode == 0
    pod_json = pod_config(directory, "att")
    ran = containerd.crictl(crictl, "runp", "--runtime", "podshim", pod_json)
    assert ran.returncode == 0, ran.stderr
    container_json = os.path.join(directory, "c.json")
    with open(container_json, "w") as f:
        json.dump({"metadata": {"name": "c"}, "image": {"image": image}, "command": command, "log_path": "c.log",
                   **config}, f)
    created = containerd.crictl(crictl, "create", ran.stdout.strip(), container_json, pod_json)
    assert created.returncode == 0, f"{created.stderr}\n{containerd.log()[-6000:]}"
    cid = created.stdout.strip()
    started = containerd.crictl(crictl, "start", cid)
    assert started.returncode == 0, f"{started.stderr}\n{containerd.log()[-6000:]}"
    return cid


def state(containerd, crictl: str, cid: str) -> str:
    return json.loads(containerd.crictl(crictl, "inspect", cid).stdout)["status"]["state"]


def wait_exited(containerd, crictl: str, cid: str) -> None:
    """Return once containerd's CRI has seen the container exit (its exit event comes after the output)."""
    deadline = time.monotonic() + SETTLE
    while state(containerd, crictl, cid) != "CONTAINER_EXITED":
        assert time.monotonic() < deadline, containerd.log()[-6000:]
        time.sleep(0.1)


def test_attach_i_feeds_a_containers_stdin_once(containerd, crictl, directory, test_images, crictl_argv) -> None:
    cid = started_container(containerd, crictl, directory, test_images.busybox.ref,
                            ["sh", "-c", "read first; echo got $first; cat; echo bye"], stdin=True, stdin_once=True)
    done = subprocess.run(crictl_argv("attach", "-i", cid), input=b"hello\nrest of it\n",
                          capture_output=True, timeout=60)
    assert done.returncode == 0, f"{done.stderr!r}\n{containerd.log()[-6000:]}"
    assert done.stdout == b"got hello\nrest of it\nbye\n"
    wait_exited(containerd, crictl, cid)
    logs = containerd.crictl(crictl, "logs", cid)
    assert logs.stdout == "got hello\nrest of it\nbye\n"


def test_attach_it_gets_a_containers_terminal(containerd, crictl, directory, test_images, crictl_argv) -> None:
    cid = started_container(containerd, crictl, directory, test_images.busybox.ref, ["sh"], stdin=True, tty=True)
    term = OnTerminal(crictl_argv("attach", "-it", cid), rows=30, cols=90)
    try:
        term.type(b"tty; echo said-$((20+3))\n")
        term.read_until(rb"/dev/pts/\d+\s+said-23")
        term.resize(33, 99)
        term.type(b"sleep 0.5; stty size\n")
        term.read_until(rb"33 99")
    finally:
        term.close()  # detached: the container runs on
    assert state(containerd, crictl, cid) == "CONTAINER_RUNNING"
    assert "said-23" in containerd.crictl(crictl, "logs", cid).stdout
