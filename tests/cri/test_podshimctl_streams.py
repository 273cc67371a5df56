"""podshimctl's streaming verbs against podshimd, driven as a person does: `exec -i` with stdin piped,
`exec -it` and `attach -it` on a terminal (a pty pair the test holds the master of), `port-forward` to
a server in the pod. The bytes arrive, and the command's exit code is podshimctl's."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess

import pytest
from test_podshimd_attach import TTY_PROGRAM
from test_podshimd_podshimctl import PODSHIMCTL, ctl
from test_podshimd_portforward import exchange, netns_of, pattern, pod_server

from support.critools import HOST_PYTHON_MOUNTS, REPO
from support.podtools import container_config, pod_config
from support.ttytools import WAIT, OnTerminal

MB = 1 << 20


@pytest.fixture
def start(daemon, crictl, tmp_path):
    """start(command, **config) -> the id of a running container in a fresh pod."""
    pod_path = tmp_path / "pod.json"
    pod_path.write_text(json.dumps(pod_config()))
    pod_id = daemon.crictl(crictl, "runp", str(pod_path)).stdout.strip()

    def start(command: list[str], **extra) -> str:
        container_id = daemon.create_container(pod_id, {**container_config(command), **extra}, str(pod_path))
        daemon.crictl(crictl, "start", container_id)
        return container_id
    start.pod_id = pod_id
    return start


def piped(daemon, *argv: str, stdin: bytes) -> subprocess.CompletedProcess:
    return subprocess.run([*PODSHIMCTL, "--runtime-root", daemon.runtime_root, *argv], cwd=REPO, input=stdin,
                          capture_output=True, timeout=120)


def test_exec_i_carries_piped_stdin_and_the_exit_code(daemon, start) -> None:
    container_id = start(["sleep", "600"])
    done = piped(daemon, "exec", "-i", container_id, "cat", stdin=b"hi\n")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"hi\n", b"")
    payload = os.urandom(3 * MB)
    done = piped(daemon, "exec", "-i", container_id, "sh", "-c", "sha256sum; echo oops >&2; exit 7", stdin=payload)
    assert done.returncode == 7, done.stderr
    assert done.stdout.split()[0].decode() == hashlib.sha256(payload).hexdigest() and done.stderr == b"oops\n"


def test_exec_without_i_does_not_read_stdin(daemon, start) -> None:
    container_id = start(["sleep", "600"])
    done = piped(daemon, "exec", container_id, "sh", "-c", "cat; echo end", stdin=b"not read\n")
    assert (done.returncode, done.stdout) == (0, b"end\n"), done.stderr


def test_exec_of_a_program_that_does_not_exist_is_one_sentence(daemon, start) -> None:
    container_id = start(["sleep", "600"])
    done = piped(daemon, "exec", "-i", container_id, "/no/such/program", stdin=b"")
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert done.stderr.startswith(b"podshimctl: ") and b"/no/such/program" in done.stderr, done.stderr


def on_terminal(daemon, argv: list[str], rows: int, cols: int) -> OnTerminal:
    """podshimctl ``argv`` on a pseudo-terminal the test holds the master of."""
    return OnTerminal([*PODSHIMCTL, "--runtime-root", daemon.runtime_root, *argv], rows, cols, cwd=REPO)


def test_exec_it_runs_on_a_terminal_in_raw_mode_its_size_followed_and_exits_with_the_code(daemon, start) -> None:
    container_id = start(["sleep", "600"])
    script = ("stty size; read -r line; echo \"got $line\"; trap 'stty size' WINCH; echo ready; "
              "read -r again; exit 5")
    term = on_terminal(daemon, ["exec", "-it", container_id, "sh", "-c", script], rows=40, cols=100)
    try:
        term.read_until(rb"40 100\r\n")  # the command's terminal has ours' size from its start
        term.type(b"hello\r")  # raw mode: the carriage return goes to the command's terminal as typed
        term.read_until(rb"got hello\r\n")
        term.read_until(rb"ready")
        term.resize(50, 120)
        term.read_until(rb"50 120")
        term.type(b"x\r")
        assert term.wait() == 5
    finally:
        term.close()


def test_attach_it_types_into_the_containers_terminal_and_detaches_on_interrupt(daemon, crictl, start) -> None:
    container_id = start(["python3", "-c", TTY_PROGRAM], stdin=True, tty=True, mounts=HOST_PYTHON_MOUNTS)
    term = on_terminal(daemon, ["attach", "-it", container_id], rows=40, cols=100)
    try:
        term.type(b"hello\n")
        term.read_until(rb"got hello on /dev/pts/\d+")
        term.resize(50, 120)
        term.read_until(rb"size 50 120")
        term.proc.kill()  # the attacher goes away: the container runs on
        term.wait()
    finally:
        term.close()
    assert json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["status"]["state"] == "CONTAINER_RUNNING"


def test_attach_i_feeds_a_pipe_once_and_ends_with_the_container(daemon, start) -> None:
    container_id = start(["sh", "-c", "read first; echo got $first; echo bye >&2"], stdin=True, stdin_once=True)
    done = piped(daemon, "attach", "-i", container_id, stdin=b"hello\n")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"got hello\n", b"bye\n")


def test_port_forward_carries_bytes_both_ways_until_interrupted(daemon, crictl, start):
    with pod_server(netns_of(daemon, crictl, start.pod_id), MB) as remote:
        proc = subprocess.Popen([*PODSHIMCTL, "--runtime-root", daemon.runtime_root, "port-forward",
                                 start.pod_id, f"0:{remote}"], cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            line = proc.stdout.readline().decode()
            found = re.fullmatch(rf"Forwarding from 127\.0\.0\.1:(\d+) -> {remote}\n", line)
            assert found, (line, proc.stderr.read() if proc.poll() is not None else "")
            for _ in range(2):  # one session, a connection after another
                payload = os.urandom(2 * MB)
                status, rest = exchange(int(found.group(1)), payload)
                assert status.decode() == f"{hashlib.sha256(payload).hexdigest()} {len(payload)}"
                assert rest == pattern(MB)
            proc.send_signal(2)  # ^C: its end, quietly
            assert proc.wait(timeout=WAIT) == 0
            assert proc.stderr.read() == b""
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()


def test_port_forward_to_a_port_nothing_listens_on_says_so_and_goes_on(daemon, crictl, start):
    with pod_server(netns_of(daemon, crictl, start.pod_id), 10) as remote:
        proc = subprocess.Popen([*PODSHIMCTL, "--runtime-root", daemon.runtime_root, "port-forward",
                                 start.pod_id, f"0:{remote + 1 if remote < 65535 else remote - 1}"], cwd=REPO,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            local = int(re.search(rb":(\d+) ->", proc.stdout.readline()).group(1))
            status, _ = exchange(local, b"x")
            assert status == b""
            line = proc.stderr.readline()
            assert line.startswith(b"podshimctl: ") and b"Connection refused" in line, line
            assert proc.poll() is None
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()


def test_a_bad_port_spec_is_one_sentence(daemon, start) -> None:
    done = ctl(daemon, "port-forward", start.pod_id, "eighty", check=False)
    assert done.returncode == 1 and done.stderr == "podshimctl: port 'eighty' must be LOCAL:REMOTE or PORT (numbers)\n"
