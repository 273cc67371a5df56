"""Tasks with a terminal through a real shim (protocol.md 7.3, **Terminal**): the task's stdio is a
pseudo-terminal of its own devpts whose master the shim holds; its output is logged as stdout and
copied to attachers; its stdin FIFO is the terminal's input; ResizePty sets its size."""

from __future__ import annotations

import asyncio
import os
import re
import stat

import pytest

from shim.rpc import FailedPrecondition, InvalidArgument

from support.proctools import fd_targets
from support.shimtools import (
    HANDLERS,
    WAIT,
    ShimLauncher,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
)


class Pod:
    """A running sandbox of a shim, and where its tasks' logs go."""

    def __init__(self, shim, log_dir: str):
        self.shim, self.log_dir = shim, log_dir
        self.call = shim.task

    async def start(self, task_id: str, *args: str, **fields) -> int:
        await self.call("Create", task_id=task_id, args=list(args), log_path=self.log(task_id), terminal=True,
                        **fields)
        return (await self.call("Start", task_id=task_id))["pid"]

    def log(self, task_id: str) -> str:
        return os.path.join(self.log_dir, task_id)

    def records(self, task_id: str) -> list[tuple[str, str, str]]:
        """(stream, tag, message) of each line of the task's log."""
        with open(self.log(task_id)) as f:
            return [tuple(line.split(" ", 3)[1:]) for line in f.read().splitlines()]  # type: ignore[misc]


@pytest.fixture(params=HANDLERS)
async def pod(request, shims: ShimLauncher, tmp_path) -> Pod:
    shim = await shims.start()
    await shim.run_sandbox(options={"runtime_handler": request.param})
    return Pod(shim, str(tmp_path))


def shim_fds(pod: Pod) -> list[str]:
    """What the shim process has open (by target)."""
    return fd_targets(pod.shim.bootstrap["pid"])


class Tap:
    """An attacher's stdout FIFO (AttachOutput), read to its end."""

    def __init__(self, path: str):
        self.path = path
        os.mkfifo(path, 0o600)
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    async def read_until(self, wanted: bytes) -> bytes:
        data = b""
        os.set_blocking(self.fd, True)
        while wanted not in data:
            chunk = await asyncio.wait_for(asyncio.to_thread(os.read, self.fd, 4096), WAIT)
            assert chunk, f"the output ended before {wanted!r}: {data!r}"
            data += chunk
        return data

    async def read_to_end(self) -> bytes:
        os.set_blocking(self.fd, True)
        data = b""
        while chunk := await asyncio.wait_for(asyncio.to_thread(os.read, self.fd, 4096), WAIT):
            data += chunk
        return data

    def close(self) -> None:
        os.close(self.fd)


async def test_a_terminal_task_runs_on_a_terminal_of_its_own_devpts_and_its_output_is_logged_as_stdout(pod) -> None:
    await pod.start("t", "sh", "-c", "tty; echo to-stderr >&2; stty size; "
                                     "read -r _ _ _ _ _ _ tty_nr _ < /proc/self/stat; echo $tty_nr; "
                                     "[ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-three")
    assert (await pod.call("Wait", task_id="t"))["exit_status"] == 0
    records = pod.records("t")
    assert {stream for stream, _, _ in records} == {"stdout"}  # one stream, as containerd logs a terminal
    lines = [message for _, tag, message in records if tag == "F"]
    assert re.fullmatch(r"/dev/pts/\d+", lines[0]), lines
    assert lines[1:3] == ["to-stderr", "0 0"]  # 0x0 until ResizePty
    assert int(lines[3]) != 0  # it is the controlling terminal of the task's session
    assert lines[4] == "all-three"
    state = await pod.call("State", task_id="t")
    assert state["terminal"] is True and state["status"] == "stopped"


async def test_stdin_is_the_terminals_input_and_its_end_is_the_terminals_end_of_file(pod) -> None:
    await pod.start("t", "sh", "-c", "read line; echo got $line; cat; echo after-eof", stdin=True)
    fifo = (await pod.call("State", task_id="t"))["stdin"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"hello\nmore\n")
    os.close(fd)
    await pod.call("CloseStdin", task_id="t")  # cat reads ^D on an empty line: its end of input
    assert (await pod.call("Wait", task_id="t"))["exit_status"] == 0
    lines = [message for _, _, message in pod.records("t")]
    # The terminal echoes what it is given, as a terminal does; then what the task wrote.
    assert "got hello" in lines and lines[-1] == "after-eof" and lines.count("more") == 2, lines
    assert not os.path.exists(fifo)


async def test_resize_pty_sets_the_size_and_the_task_is_told(pod, tmp_path) -> None:
    await pod.start("t", "sh", "-c", "trap 'stty size; exit 0' WINCH; read go; echo ready; "
                                     "while :; do sleep 0.1; done", stdin=True)
    tap = Tap(str(tmp_path / "out"))
    try:
        await pod.call("AttachOutput", task_id="t", stdout=tap.path)
        fd = os.open((await pod.call("State", task_id="t"))["stdin"], os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"go\n")
        os.close(fd)
        await tap.read_until(b"ready\r\n")  # its trap is set: a resize now is seen
        await pod.call("ResizePty", task_id="t", width=100, height=40)
        assert b"40 100" in await tap.read_until(b"40 100")
        assert (await pod.call("Wait", task_id="t"))["exit_status"] == 0
    finally:
        tap.close()


async def test_attachers_get_the_terminals_output_on_stdout_and_their_stderr_fifo_just_ends(pod, tmp_path) -> None:
    await pod.start("t", "sh", "-c", "read x; echo out $x; echo err >&2", stdin=True)
    out, err = Tap(str(tmp_path / "out")), Tap(str(tmp_path / "err"))
    try:
        await pod.call("AttachOutput", task_id="t", stdout=out.path, stderr=err.path)
        fd = os.open((await pod.call("State", task_id="t"))["stdin"], os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"go\n")
        os.close(fd)
        assert await out.read_to_end() == b"go\r\nout go\r\nerr\r\n"  # the echo, then the task's lines
        assert await err.read_to_end() == b""
    finally:
        out.close()
        err.close()


async def test_resize_pty_is_refused_for_a_task_without_a_terminal_or_a_size_out_of_range(pod) -> None:
    await pod.call("Create", task_id="plain", args=["sleep", "600"], log_path=pod.log("plain"))
    with pytest.raises(FailedPrecondition, match="not been started"):
        await pod.call("ResizePty", task_id="plain", width=80, height=24)
    await pod.call("Start", task_id="plain")
    with pytest.raises(FailedPrecondition, match="has no terminal"):
        await pod.call("ResizePty", task_id="plain", width=80, height=24)
    await pod.start("t", "sleep", "600")
    with pytest.raises(InvalidArgument, match="'width'"):
        await pod.call("ResizePty", task_id="t", width=70000, height=24)
    with pytest.raises(InvalidArgument, match="'height' is required"):
        await pod.call("ResizePty", task_id="t", width=80)


async def test_a_terminal_task_leaves_no_fd_in_the_shim(pod) -> None:
    await pod.start("warmup", "true")  # the shim's own lazily opened files
    await pod.call("Wait", task_id="warmup")
    await pod.call("Delete", task_id="warmup")
    before = shim_fds(pod)
    await pod.start("t", "sh", "-c", "cat", stdin=True)
    await pod.call("ResizePty", task_id="t", width=80, height=24)
    assert any("ptmx" in fd for fd in shim_fds(pod))  # the shim holds the master while the task runs
    await pod.call("Kill", task_id="t", signal=9)
    await pod.call("Wait", task_id="t")
    await pod.call("Delete", task_id="t")
    assert shim_fds(pod) == before
