"""Where clone3 is refused (a seccomp filter answering ENOSYS, as Docker's default does; a kernel
before 5.7), a shim still starts its pause and its tasks in their cgroups, and execs into a task:
asked once (cgroups.birth_in_v2_allowed), the shim then has each launcher move itself into the
v2 cgroup first thing, before it joins any namespace (an exec's joins the task's mount namespace,
where the host's cgroup paths do not lead), as it did into the v1 ones."""

from __future__ import annotations

import os

import pytest

from support.shimtools import (
    ShimLauncher,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
)

# Loaded by every Python the test starts with site (`podshim start` and the shim it forks):
# clone3 answers ENOSYS, and each refusal leaves a line in a file the test reads.
SITECUSTOMIZE = '''
import errno, os
import shim.kernel.linux as _linux

def _refused(flags, cgroup_fd=-1):
    with open(os.environ["PODSHIM_TEST_CLONE3_LOG"], "a") as log:
        log.write("refused\\n")
    raise OSError(errno.ENOSYS, "clone3 refused by the test")

_linux.clone3 = _refused
'''


@pytest.fixture
def clone3_refused(tmp_path, monkeypatch) -> str:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "clone3.log"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("PODSHIM_TEST_CLONE3_LOG", str(log))
    monkeypatch.setenv("PODSHIM_TEMPLATE", "0")  # `podshim start` forks the shim itself, with site
    monkeypatch.delenv("PODSHIM_TEMPLATE_SOCKET", raising=False)
    return str(log)


async def test_pause_task_and_exec_start_in_their_cgroups_without_clone3(clone3_refused, shims: ShimLauncher,
                                                                         tmp_path) -> None:
    shim = await shims.start()
    pause_pid = await shim.run_sandbox()
    info = await shim.info()
    v2 = info.get("cgroup.unified")
    if v2 is None:
        pytest.skip("no cgroup v2 hierarchy: nothing is entered by clone3 here")

    call = shim.task
    await call("Create", task_id="app", args=["sleep", "600"], log_path=str(tmp_path / "app.log"))
    task_pid = (await call("Start", task_id="app"))["pid"]
    reply = await call("Exec", task_id="app", args=["cat", "/proc/self/cgroup"])
    assert reply["exit_status"] == 0, reply
    with open(clone3_refused) as f:
        assert f.read().splitlines() == ["refused"]  # asked once; no launch tried it again
    with open(os.path.join(v2, "cgroup.procs")) as f:
        assert str(pause_pid) in f.read().split()
    with open(f"/proc/{task_pid}/cgroup") as f:
        assert sorted(reply["stdout"].decode().splitlines()) == sorted(f.read().splitlines())
