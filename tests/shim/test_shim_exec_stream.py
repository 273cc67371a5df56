"""ExecStart, ExecWait and ExecKill through a real shim (protocol.md 7.3): a command whose stdio are the
client's FIFOs or terminal, waited for and killed by its exec id."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import stat
import termios

import pytest

from shim.api.defaults import FIFO_READER_WAIT
from shim.rpc import FailedPrecondition, InvalidArgument, NotFound

from support.proctools import wait_gone_async
from support.shimtools import (
    HANDLERS,
    WAIT,
    ShimLauncher,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
)


class Pod:
    handler = ""  # the runtime handler it runs on (the fixture's)

    def __init__(self, shim, log_dir: str):
        self.shim = shim
        self.log_dir = log_dir
        self.call = shim.task  # a Task method for this sandbox

    async def run(self, task_id: str, *args: str) -> int:
        await self.call("Create", task_id=task_id, args=list(args), log_path=os.path.join(self.log_dir, task_id))
        return (await self.call("Start", task_id=task_id))["pid"]


@pytest.fixture(params=HANDLERS)
async def pod(request, shims: ShimLauncher, tmp_path) -> Pod:
    shim = await shims.start()
    await shim.run_sandbox(options={"runtime_handler": request.param})
    pod = Pod(shim, str(tmp_path))
    pod.handler = request.param
    await pod.run("app", "sleep", "600")
    return pod


class Fifos:
    """The client's side: stdin held for writing, stdout and stderr for reading (protocol.md's order)."""

    def __init__(self, directory: str):
        self.paths = {name: os.path.join(directory, name) for name in ("stdin", "stdout", "stderr")}
        for path in self.paths.values():
            os.mkfifo(path, 0o600)
        holder = os.open(self.paths["stdin"], os.O_RDONLY | os.O_NONBLOCK)
        self.stdin = os.open(self.paths["stdin"], os.O_WRONLY)
        os.close(holder)
        self.stdout = os.open(self.paths["stdout"], os.O_RDONLY | os.O_NONBLOCK)
        self.stderr = os.open(self.paths["stderr"], os.O_RDONLY | os.O_NONBLOCK)

    def close(self) -> None:
        for fd in (self.stdin, self.stdout, self.stderr):
            if fd >= 0:
                os.close(fd)


def terminal_output(master: int) -> str:
    """What a terminal's master gives until every slave fd is closed (EIO), without its carriage returns."""
    output = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the command closed the terminal
            break
        if not chunk:
            break
        output += chunk
    return output.decode().replace("\r", "")


def read_to_end(fd: int) -> bytes:
    os.set_blocking(fd, True)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    return data


async def test_exec_start_streams_stdin_to_stdout_and_stderr_and_wait_answers_its_exit(pod, tmp_path) -> None:
    fifos = Fifos(str(tmp_path))
    try:
        started = await pod.call("ExecStart", task_id="app", args=["sh", "-c", "tr a-z A-Z; echo done >&2; exit 4"],
                                 **fifos.paths)
        assert set(started) == {"exec_id", "pid"}
        os.write(fifos.stdin, b"hello\n")
        os.close(fifos.stdin)
        fifos.stdin = -1
        out, err = await asyncio.gather(asyncio.to_thread(read_to_end, fifos.stdout),
                                        asyncio.to_thread(read_to_end, fifos.stderr))
        assert (out, err) == (b"HELLO\n", b"done\n")
        assert (await pod.call("ExecWait", task_id="app", exec_id=started["exec_id"]))["exit_status"] == 4
        with pytest.raises(NotFound):
            await pod.call("ExecWait", task_id="app", exec_id=started["exec_id"])  # forgotten once waited for
    finally:
        fifos.close()


async def test_exec_kill_ends_the_command_and_what_it_started(pod, tmp_path) -> None:
    fifos = Fifos(str(tmp_path))
    try:
        started = await pod.call("ExecStart", task_id="app", args=["sh", "-c", "sleep 300 & echo $!; wait"],
                                 stdout=fifos.paths["stdout"])
        os.set_blocking(fifos.stdout, True)
        child = int(os.read(fifos.stdout, 100).split()[0])
        await pod.call("ExecKill", task_id="app", exec_id=started["exec_id"])
        assert (await pod.call("ExecWait", task_id="app", exec_id=started["exec_id"]))["exit_status"] == 137
        # the pid printed is in the task's pid namespace: its processes are gone from the host's view too
        assert not await wait_gone_async(started["pid"], timeout=WAIT)
        assert child > 0
    finally:
        fifos.close()


async def test_exec_start_refuses_what_is_not_a_fifo_or_a_terminal(pod, tmp_path) -> None:
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(InvalidArgument, match="is not a FIFO"):
        await pod.call("ExecStart", task_id="app", args=["true"], stdout=str(regular))
    with pytest.raises(InvalidArgument, match="is not a terminal"):
        await pod.call("ExecStart", task_id="app", args=["true"], terminal=str(regular))
    with pytest.raises(InvalidArgument, match="give it alone"):
        await pod.call("ExecStart", task_id="app", args=["true"], terminal="/dev/ptmx", stdout=str(regular))
    fifo = tmp_path / "nobody-reads"
    os.mkfifo(fifo)
    with pytest.raises(InvalidArgument, match="cannot open"):  # ENXIO: the client holds no reader
        await pod.call("ExecStart", task_id="app", args=["true"], stdout=str(fifo))
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


async def test_exec_start_waits_for_a_reader_that_opens_its_fifo_just_after_the_call(pod, tmp_path) -> None:
    # containerd's fifo package opens the reading end in a goroutine of its own: it may come after ExecStart.
    fifo = tmp_path / "late-reader"
    os.mkfifo(fifo)
    call = asyncio.ensure_future(pod.call("ExecStart", task_id="app", args=["echo", "late"], stdout=str(fifo)))
    await asyncio.sleep(0.3)
    assert not call.done()
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        started = await call
        assert (await pod.call("ExecWait", task_id="app", exec_id=started["exec_id"]))["exit_status"] == 0
        assert os.read(reader, 100) == b"late\n"
    finally:
        os.close(reader)


async def test_exec_start_on_a_terminal_makes_it_the_controlling_terminal(pod, request) -> None:
    master, slave = os.openpty()
    try:
        fields = {"terminal": os.ttyname(slave)}
        if request.node.callspec.params["pod"] != "native":
            with pytest.raises(FailedPrecondition, match="makes the terminal itself: give console_socket"):
                await pod.call("ExecStart", task_id="app", args=["true"], **fields)
            return
        # By device, not by name: the host's pty is not in the task's own /dev/pts.
        tty_nr = os.stat(slave).st_rdev
        started = await pod.call("ExecStart", task_id="app", **fields, args=[
            "sh", "-c", "read -r _ _ _ _ _ _ tty_nr _ < /proc/self/stat; echo $tty_nr; stty size"])
        os.close(slave)
        slave = -1
        assert (await pod.call("ExecWait", task_id="app", exec_id=started["exec_id"]))["exit_status"] == 0
        lines = terminal_output(master).split("\n")
        assert lines[0] == str(tty_nr) and lines[1] == "{} {}".format(*termios.tcgetwinsize(master))
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


async def test_exec_start_with_a_console_socket_sends_the_master_of_a_terminal_of_the_tasks_devpts(pod, tmp_path) -> None:
    # In a directory whose path is longer than a socket address may be (as podshimd's may be).
    directory = tmp_path / ("d" * 100)
    directory.mkdir()
    path = str(directory / "console.sock")
    assert len(path) > 108
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dir_fd = os.open(directory, os.O_PATH)
    try:
        listener.bind(f"/proc/self/fd/{dir_fd}/console.sock")
    finally:
        os.close(dir_fd)
    listener.listen(1)
    master = -1
    try:
        started = await pod.call("ExecStart", task_id="app", console_socket=path, console_width=100,
                                 console_height=40, args=[
                                     "sh", "-c", "tty; stty size; read -r _ _ _ _ _ _ tty_nr _ < /proc/self/stat; "
                                     "echo $tty_nr; read line; echo got $line"])
        listener.settimeout(WAIT)
        conn, _ = await asyncio.to_thread(listener.accept)
        with conn:
            _, fds, _, _ = socket.recv_fds(conn, 16, 1)
        master = fds[0]
        assert os.isatty(master)
        os.write(master, b"typed\n")
        assert (await pod.call("ExecWait", task_id="app", exec_id=started["exec_id"]))["exit_status"] == 0
        # (without the terminal's echo of the input, which may come anywhere among the first lines)
        lines = [line for line in terminal_output(master).split("\n") if line != "typed"]
        assert re.fullmatch(r"/dev/pts/\d+", lines[0]), lines  # of the task's own devpts
        assert lines[1] == "40 100" and int(lines[2]) != 0 and "got typed" in lines, lines
    finally:
        listener.close()
        if master >= 0:
            os.close(master)


async def test_exec_start_refuses_a_console_socket_that_is_no_socket_or_with_other_stdio(pod, tmp_path) -> None:
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(InvalidArgument, match="is not a unix socket"):
        await pod.call("ExecStart", task_id="app", args=["true"], console_socket=str(regular))
    with pytest.raises(InvalidArgument, match="give it alone"):
        await pod.call("ExecStart", task_id="app", args=["true"], console_socket=str(regular), stdout=str(regular))
    with pytest.raises(InvalidArgument, match="go with 'console_socket'"):
        await pod.call("ExecStart", task_id="app", args=["true"], console_width=80)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "closed.sock"))  # bound, but nobody listens: refused
    try:
        with pytest.raises(InvalidArgument, match="console_socket"):
            await pod.call("ExecStart", task_id="app", args=["true"], console_socket=str(tmp_path / "closed.sock"))
    finally:
        listener.close()


async def test_exec_ids_unknown_to_wait_and_kill_are_not_found(pod) -> None:
    with pytest.raises(NotFound):
        await pod.call("ExecWait", task_id="app", exec_id="99")
    with pytest.raises(NotFound):
        await pod.call("ExecKill", task_id="app", exec_id="99")


async def test_a_task_created_with_stdin_reads_the_fifo_its_shim_keeps_open_until_close_stdin(pod) -> None:
    await pod.call("Create", task_id="reader", args=["sh", "-c", "cat; echo eof"],
                   log_path=os.path.join(pod.log_dir, "reader"), stdin=True)
    await pod.call("Start", task_id="reader")
    fifo = (await pod.call("State", task_id="reader"))["stdin"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and stat.S_IMODE(os.stat(fifo).st_mode) == 0o600
    for word in (b"one\n", b"two\n"):  # two writers one after the other: the task sees no end between them
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, word)
        os.close(fd)
    await pod.call("CloseStdin", task_id="reader")
    assert (await pod.call("State", task_id="reader"))["stdin"] == ""
    assert (await pod.call("Wait", task_id="reader"))["exit_status"] == 0
    with open(os.path.join(pod.log_dir, "reader")) as f:
        assert [line.split(" ", 3)[3] for line in f.read().splitlines()] == ["one", "two", "eof"]
    assert not os.path.exists(fifo)  # removed when the task stopped


async def test_a_task_without_stdin_has_none(pod) -> None:
    assert (await pod.call("State", task_id="app"))["stdin"] == ""


async def start_talker(pod, tmp_path) -> dict[str, str]:
    """A task "talker" that waits for a line on its stdin, then echoes it on stdout and "err" on
    stderr; and AttachOutput's two FIFOs, made (not opened), by stream."""
    await pod.call("Create", task_id="talker", args=["sh", "-c", "read x; echo out $x; echo err >&2"],
                   log_path=os.path.join(pod.log_dir, "talker"), stdin=True)
    await pod.call("Start", task_id="talker")
    taps = {name: str(tmp_path / name) for name in ("stdout", "stderr")}
    for path in taps.values():
        os.mkfifo(path, 0o600)
    return taps


async def tell_talker(pod, line: bytes) -> None:
    """Write ``line`` to the talker's stdin (the shim's FIFO)."""
    fd = os.open((await pod.call("State", task_id="talker"))["stdin"], os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def test_attach_output_copies_what_the_task_writes_and_ends_with_it(pod, tmp_path) -> None:
    taps = await start_talker(pod, tmp_path)
    fds = {name: os.open(path, os.O_RDONLY | os.O_NONBLOCK) for name, path in taps.items()}
    try:
        await pod.call("AttachOutput", task_id="talker", **taps)
        await tell_talker(pod, b"go\n")
        out, err = await asyncio.gather(asyncio.to_thread(read_to_end, fds["stdout"]),
                                        asyncio.to_thread(read_to_end, fds["stderr"]))
        assert (out, err) == (b"out go\n", b"err\n")  # then end-of-file: the task stopped
    finally:
        for fd in fds.values():
            os.close(fd)


async def test_attach_output_waits_for_a_reader_that_opens_its_fifo_just_after_the_call(pod, tmp_path) -> None:
    # podshimd's streaming (and containerd's fifo package) may open the reading end after the request.
    taps = await start_talker(pod, tmp_path)
    call = asyncio.ensure_future(pod.call("AttachOutput", task_id="talker", **taps))
    await asyncio.sleep(0.3)
    assert not call.done()  # not refused at once: it waits for the readers
    fds = {name: os.open(path, os.O_RDONLY | os.O_NONBLOCK) for name, path in taps.items()}
    try:
        await call
        await tell_talker(pod, b"late\n")
        out, err = await asyncio.gather(asyncio.to_thread(read_to_end, fds["stdout"]),
                                        asyncio.to_thread(read_to_end, fds["stderr"]))
        assert (out, err) == (b"out late\n", b"err\n")
    finally:
        for fd in fds.values():
            os.close(fd)


async def test_attach_output_is_refused_naming_the_fifo_nobody_opened_for_reading_and_attaches_none(
        pod, tmp_path) -> None:
    taps = await start_talker(pod, tmp_path)
    reader = os.open(taps["stdout"], os.O_RDONLY | os.O_NONBLOCK)  # stderr's is never opened
    try:
        expected = (f"field 'stderr': cannot open FIFO {taps['stderr']} for writing: nobody opened it for "
                    f"reading within {FIFO_READER_WAIT:g} s")
        with pytest.raises(InvalidArgument, match=re.escape(expected)):
            await pod.call("AttachOutput", task_id="talker", **taps)
        # stdout's write end the shim opened is closed again: its reader sees no writer, and gets nothing.
        assert os.read(reader, 100) == b""
        await tell_talker(pod, b"go\n")
        assert (await pod.call("Wait", task_id="talker"))["exit_status"] == 0
        assert os.read(reader, 100) == b""
        with open(os.path.join(pod.log_dir, "talker")) as f:
            assert [line.split(" ", 1)[1] for line in f.read().splitlines()] in (  # logged, not copied
                ["stdout F out go", "stderr F err"], ["stderr F err", "stdout F out go"])
    finally:
        os.close(reader)
