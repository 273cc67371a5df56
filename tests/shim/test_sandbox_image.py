"""A sandbox image's pause through a real shim, with each runtime handler (protocol.md 7.1 and 7.4,
``pause_image``): CreateSandbox mounts ``rootfs`` on ``<bundle>/rootfs`` and the pause is the
image's program run from it, its own argv, in the pod's namespaces; nothing assumes catatonit (a
tiny C pause runs as well); ShutdownSandbox and ``podshim delete`` unmount the rootfs."""

from __future__ import annotations

import json
import os
import shutil
import signal
from typing import Any

import pytest

from shim.api.names import TASK_SERVICE
from shim.lib.processes import process_alive
from shim.lib.rootfs import is_mount_point
from shim.rpc import FailedPrecondition, InvalidArgument

from support.imagebuild import CATATONIT, compiled, tiny_pause_binary
from support.shimtools import (
    HANDLERS,
    NODE_ROOT,
    WAIT,
    ShimLauncher,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
    ns_inode,
)

#: (program in the rootfs, pause_image) of each pause image.
PAUSES: dict[str, tuple[str, dict[str, Any]]] = {
    "catatonit": ("catatonit", {"args": ["/catatonit", "-P"]}),
    "tiny": ("bin/tiny-pause", {"args": ["tiny-pause", "--pod"], "env": ["PATH=/bin", "PAUSE=tiny"], "cwd": "/bin"}),
}


@pytest.fixture(scope="module")
def pause_roots(tmp_path_factory) -> dict[str, str]:
    """A root directory per pause image, holding its one program."""
    roots = {}
    for kind, (program, _) in PAUSES.items():
        root = tmp_path_factory.mktemp(f"root-{kind}")
        target = root / program
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind == "catatonit":
            shutil.copy(CATATONIT, target)
        else:
            target.write_bytes(tiny_pause_binary(str(tmp_path_factory.mktemp("cc"))))
        target.chmod(0o755)
        roots[kind] = str(root)
    return roots


def bind(root: str) -> list[dict]:
    return [{"type": "bind", "source": root, "options": ["rbind", "rw"]}]


@pytest.mark.parametrize("kind", list(PAUSES))
@pytest.mark.parametrize("handler", HANDLERS)
async def test_the_pause_is_the_image_program_in_its_rootfs(shims: ShimLauncher, pause_roots, handler, kind, tmp_path) -> None:
    shim = await shims.start()
    image = PAUSES[kind][1]
    pid = await shim.run_sandbox(rootfs=bind(pause_roots[kind]),
                                 options={"runtime_handler": handler, "pause_image": {**image, "image": f"x/{kind}"}})
    mount_point = os.path.join(shim.bundle, "rootfs")
    assert is_mount_point(mount_point) and shim.record()["rootfs"] == mount_point
    assert os.path.samefile(f"/proc/{pid}/root", mount_point)
    assert os.path.samefile(f"/proc/{pid}/exe", os.path.join(pause_roots[kind], PAUSES[kind][0]))
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[:-1] == [a.encode() for a in image["args"]]
    info = await shim.info()
    assert (info["pause_rootfs"], json.loads(info["pause_args"]), info["pause_image"]) == (
        mount_point, image["args"], f"x/{kind}")
    assert ns_inode(pid, "net") == os.stat(info["netns_path"]).st_ino
    # A task joins the pause's namespaces.
    assert shim.client is not None
    await shim.client.call(TASK_SERVICE, "Create", {"sandbox_id": shim.sandbox_id, "task_id": "t", "pid_mode": "POD",
                                                    "args": ["sleep", "100"], "log_path": str(tmp_path / "t.log"),
                                                    "rootfs": NODE_ROOT, "readonly_rootfs": True},
                           timeout=WAIT)
    task = (await shim.client.call(TASK_SERVICE, "Start", {"sandbox_id": shim.sandbox_id, "task_id": "t"},
                                   timeout=WAIT))["pid"]
    assert [ns_inode(task, ns) for ns in ("net", "ipc", "uts", "pid")] == [
        ns_inode(pid, ns) for ns in ("net", "ipc", "uts", "pid")]
    await shim.call("StopSandbox", timeout_secs=5)
    assert (await shim.call("WaitSandbox"))["exit_status"] == 0  # it handled SIGTERM
    await shim.call("ShutdownSandbox")
    assert not os.path.exists(mount_point)


#: A pause that handles no signal at all: PID 1 of its pid namespace, it never sees SIGTERM.
SLEEP_ONLY_C = "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n"


@pytest.mark.parametrize("handler", HANDLERS)
async def test_a_pause_that_never_handles_sigterm_starts_and_is_killed_at_the_stop_timeout(
        shims: ShimLauncher, handler, tmp_path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "sleeper").write_bytes(compiled(str(tmp_path), "sleeper", SLEEP_ONLY_C, ["-static", "-s"],
                                                         "a sleep-only pause"))
    (tmp_path / "root" / "sleeper").chmod(0o755)
    shim = await shims.start()
    pid = await shim.run_sandbox(rootfs=bind(str(tmp_path / "root")),
                                 options={"runtime_handler": handler, "pause_image": {"args": ["/sleeper"]}})
    assert os.path.samefile(f"/proc/{pid}/root", os.path.join(shim.bundle, "rootfs"))
    await shim.call("StopSandbox", timeout_secs=1)
    assert (await shim.call("WaitSandbox"))["exit_status"] == 128 + signal.SIGKILL
    await shim.call("ShutdownSandbox")
    assert not os.path.exists(os.path.join(shim.bundle, "rootfs"))


@pytest.mark.parametrize("handler", HANDLERS)
async def test_podshim_delete_unmounts_the_rootfs_of_a_killed_shim(shims: ShimLauncher, pause_roots, handler) -> None:
    shim = await shims.start()
    pid = await shim.run_sandbox(rootfs=bind(pause_roots["tiny"]),
                                 options={"runtime_handler": handler, "pause_image": PAUSES["tiny"][1]})
    mount_point = os.path.join(shim.bundle, "rootfs")
    start_time = shim.record()["pause"]["start_time"]
    shim.process.kill(signal.SIGKILL)
    await shim.process.exited()
    assert is_mount_point(mount_point)
    result = shim.delete()
    assert result.returncode == 0, result.stderr
    assert not is_mount_point(mount_point) and not os.path.exists(mount_point)
    assert not process_alive(pid, start_time)
    assert shim.record()["rootfs"] == ""


@pytest.mark.parametrize("fields, sentence", [
    ({"options": {"pause_image": {"args": ["/catatonit"]}}}, "rootfs and options.pause_image go together"),
    ({"rootfs": "ROOT", "options": {}}, "rootfs and options.pause_image go together"),
    ({"rootfs": "ROOT", "options": {"pause_image": {"args": []}}}, "pause_image.args must be a non-empty array"),
    ({"rootfs": "ROOT", "options": {"pause_image": {"args": ["/catatonit"], "cwd": "bin"}}},
     "pause_image.cwd must be an absolute path"),
    ({"rootfs": "ROOT", "options": {"pause_image": {"args": ["/catatonit"]}, "pause_binary": "/bin/true"}},
     "pause_binary and pause_image are both set"),
])
async def test_a_bad_pause_image_is_refused_before_anything_is_made(shims: ShimLauncher, pause_roots, fields,
                                                                    sentence) -> None:
    shim = await shims.start()
    if fields.get("rootfs") == "ROOT":
        fields = {**fields, "rootfs": bind(pause_roots["catatonit"])}
    with pytest.raises(InvalidArgument, match=sentence):
        await shim.call("CreateSandbox", **fields)
    assert not os.path.exists(os.path.join(shim.bundle, "rootfs"))


@pytest.mark.parametrize("handler", HANDLERS)
async def test_a_program_the_rootfs_lacks_fails_start_and_leaves_nothing_running(shims: ShimLauncher, pause_roots,
                                                                                 handler) -> None:
    shim = await shims.start()
    await shim.call("CreateSandbox", rootfs=bind(pause_roots["catatonit"]),
                    options={"runtime_handler": handler, "pause_image": {"args": ["/no-such-pause"]}})
    with pytest.raises((FailedPrecondition,)) as caught:
        await shim.call("StartSandbox")
    assert "/no-such-pause" in caught.value.message
    assert not shim.record()["pause"]
    await shim.call("ShutdownSandbox")
    assert not os.path.exists(os.path.join(shim.bundle, "rootfs"))
