"""Attacks on the node through the pod's pause, run from inside real containers on every handler.

With the pod's pid namespace shared (mode POD, kubelet's ``shareProcessNamespace: true``), PID 1
of a container's /proc is the pause, and ``/proc/1/root`` and ``/proc/1/cwd`` are its root and
working directory. The pause runs in a root of its own that holds nothing of the node (its
program at most), read-only: a container's root user can neither read the node's files through
it, nor write them, nor start in the node's directories. Each test checks the host afterwards.
"""

from __future__ import annotations

import grpc
import pytest
from attacktools import canary_untouched, plant_canary

#: Names in the node's / that a view of it would show.
NODE_ENTRIES = {"etc", "home", "var", "tmp", "run", "root", "work", "opt"}
POD_PID = 0  # NamespaceMode POD


@pytest.fixture
def canary_dir(tmp_path):
    """A directory on the host with a canary in it (nothing else may appear there)."""
    directory = tmp_path / "canary-dir"
    directory.mkdir()
    plant_canary(str(directory))
    return str(directory)


def test_proc_1_root_of_a_pod_pid_container_shows_nothing_of_the_node(cri, handler) -> None:
    container_id = cri.run(cri.run_pod(handler), pid=POD_PID)
    listed = cri.exec(container_id, "ls -a /proc/1/root/")
    assert not NODE_ENTRIES & set(listed.stdout.split()), listed
    shadow = cri.exec(container_id, "cat /proc/1/root/etc/shadow")
    assert shadow.exit_code != 0 and "root:" not in shadow.stdout


def test_a_pod_pid_container_cannot_read_or_write_the_node_through_proc_1_root(cri, handler, canary_dir) -> None:
    container_id = cri.run(cri.run_pod(handler), pid=POD_PID)
    through = f"/proc/1/root{canary_dir}"
    read = cri.exec(container_id, f"cat {through}/canary")
    assert read.exit_code != 0 and "canary" not in read.stdout
    for script in (f"echo pwned > {through}/canary", f"echo pwned > {through}/added",
                   f"mkdir -p {through}/made", "echo pwned > /proc/1/root/podshim-escaped",
                   "mkdir /proc/1/root/podshim-escaped-dir"):
        assert cri.exec(container_id, script).exit_code != 0, script
    assert canary_untouched(canary_dir)


def test_the_container_process_itself_cannot_write_through_proc_1_root(cri, handler, canary_dir) -> None:
    # The attack as the container's own command (started, not exec'd), then observed from an exec.
    pod = cri.run_pod(handler)
    attacker = cri.create(pod, ["sh", "-c", f"echo pwned > /proc/1/root{canary_dir}/canary; "
                                            f"echo pwned > /proc/1/root{canary_dir}/added; sleep 600"], pid=POD_PID)
    cri.start(attacker)
    cri.exec(attacker, "true")  # it has run its writes by the time an exec is done: it runs them first
    assert canary_untouched(canary_dir)


def test_proc_1_cwd_is_the_pause_root_not_a_node_directory(cri, handler) -> None:
    container_id = cri.run(cri.run_pod(handler), pid=POD_PID)
    listed = cri.exec(container_id, "ls -a /proc/1/cwd/")
    assert not NODE_ENTRIES & set(listed.stdout.split()), listed


def test_a_working_dir_through_proc_1_root_never_starts_in_the_daemons_state(cri, handler) -> None:
    # A container asking to start in the node's directory of podshimd's own files.
    pod = cri.run_pod(handler)
    try:
        container_id = cri.run(pod, pid=POD_PID, working_dir=f"/proc/1/root{cri.daemon.directory}")
    except grpc.RpcError as refused:  # the directory is not there (nor can it be made): refused
        assert refused.details(), refused
        return
    listed = cri.exec(container_id, "ls -a")  # an exec starts in the container's working directory
    assert "config.toml" not in listed.stdout and "podshimd.log" not in listed.stdout, listed


def test_an_exec_in_a_pod_pid_container_runs_in_the_container_root_only(cri, handler, canary_dir) -> None:
    container_id = cri.run(cri.run_pod(handler), pid=POD_PID)
    assert "podshim-test" in cri.exec(container_id, "ls /").stdout.split()  # the image's root
    for path in (canary_dir, f"/proc/self/root{canary_dir}", f"/proc/self/cwd{canary_dir}"):
        shown = cri.exec(container_id, f"cat {path}/canary")
        assert shown.exit_code != 0 and "canary" not in shown.stdout, (path, shown)
