"""CRI 1.37's kernel features through podshimd's gRPC, on every runtime handler: recursive read-only
mounts (and the handler features Status reports for them), the supplemental groups policy and the
user ContainerStatus reports."""

from __future__ import annotations

import json
import subprocess

import grpc
import pytest

from shim.cri.api import api_pb2

from support.podtools import container_config, pod_config
from support.shimtools import HANDLERS


@pytest.fixture(params=HANDLERS)
def handler(request) -> str:
    return request.param


@pytest.fixture
def pod(daemon, crictl, tmp_path, handler) -> tuple[str, str]:
    """A ready pod of ``handler``: its id and the path of its config."""
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod_config()))
    return daemon.crictl(crictl, "runp", "--runtime", handler, str(path)).stdout.strip(), str(path)


@pytest.fixture
def volume_with_a_submount(tmp_path):
    """A host directory with a tmpfs mounted on its subdirectory ``sub`` (unmounted after)."""
    volume = tmp_path / "volume"
    (volume / "sub").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(volume / "sub")], check=True)
    try:
        yield volume
    finally:
        subprocess.run(["umount", "-l", str(volume / "sub")], check=True)


def running(daemon, crictl, pod, config: dict) -> str:
    pod_id, pod_path = pod
    container_id = daemon.create_container(pod_id, config, pod_path)
    daemon.crictl(crictl, "start", container_id)
    return container_id


def exec_sh(daemon, crictl, container_id: str, script: str) -> subprocess.CompletedProcess:
    return daemon.crictl(crictl, "exec", container_id, "sh", "-c", script, check=False)


def test_status_reports_recursive_read_only_mounts_for_every_handler(daemon) -> None:
    status = daemon.runtime().Status(api_pb2.StatusRequest(), timeout=10)
    features = {h.name: h.features.recursive_read_only_mounts for h in status.runtime_handlers}
    assert features == {"": True, **{name: True for name in HANDLERS}}


def test_a_recursive_read_only_mount_makes_the_mounts_below_it_read_only(daemon, crictl, pod,
                                                                         volume_with_a_submount) -> None:
    config = container_config(["sleep", "600"])
    config["mounts"] = [{"container_path": "/ro", "host_path": str(volume_with_a_submount), "readonly": True},
                        {"container_path": "/rro", "host_path": str(volume_with_a_submount), "readonly": True,
                         "recursive_read_only": True}]
    container_id = running(daemon, crictl, pod, config)
    # A plain read-only bind leaves the mount below it writable; a recursive one does not.
    assert exec_sh(daemon, crictl, container_id, "touch /ro/sub/x").returncode == 0
    for path in ("/rro/x", "/rro/sub/y"):
        done = exec_sh(daemon, crictl, container_id, f"touch {path}")
        assert done.returncode != 0 and "Read-only file system" in done.stdout + done.stderr, done
    mounts = exec_sh(daemon, crictl, container_id, "grep ' /rro' /proc/self/mountinfo").stdout.splitlines()
    assert len(mounts) == 2 and all(line.split()[5].split(",")[0] == "ro" for line in mounts), mounts


@pytest.mark.parametrize("mount, sentence", [
    ({"readonly": False}, "recursive_read_only needs readonly to be true as well"),
    ({"readonly": True, "propagation": "PROPAGATION_HOST_TO_CONTAINER"},
     "recursive_read_only needs propagation PROPAGATION_PRIVATE, not PROPAGATION_HOST_TO_CONTAINER"),
])
def test_a_recursive_read_only_mount_must_be_read_only_and_private(daemon, crictl, pod, tmp_path, mount, sentence) -> None:
    config = container_config(["sleep", "600"])
    config["mounts"] = [{"container_path": "/rro", "host_path": str(tmp_path), "recursive_read_only": True, **mount}]
    with pytest.raises(grpc.RpcError) as raised:
        daemon.create_container(pod[0], config, pod[1])
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sentence in raised.value.details()


def test_status_reports_the_supplemental_groups_policy_feature(daemon) -> None:
    assert daemon.runtime().Status(api_pb2.StatusRequest(), timeout=10).features.supplemental_groups_policy


# The tests' busybox has root in the group wheel (10) of its /etc/group.
@pytest.mark.parametrize("policy, groups", [(None, [0, 10, 1234]), ("Merge", [0, 10, 1234]), ("Strict", [0, 1234])])
def test_the_supplemental_groups_policy_says_whether_the_images_groups_are_added(daemon, crictl, pod, policy,
                                                                                 groups) -> None:
    config = container_config(["sleep", "600"])
    context = config["linux"]["security_context"]
    context["supplemental_groups"] = [1234]
    if policy is not None:
        context["supplemental_groups_policy"] = policy
    container_id = running(daemon, crictl, pod, config)
    assert exec_sh(daemon, crictl, container_id, "id -G").stdout.split() == [str(g) for g in groups]
    status = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id),
                                              timeout=10).status
    assert (status.user.linux.uid, status.user.linux.gid) == (0, 0)
    assert sorted(status.user.linux.supplemental_groups) == groups


def test_container_status_reports_the_user_the_process_really_has(daemon, crictl, pod) -> None:
    config = container_config(["sleep", "600"])
    config["linux"]["security_context"].update(run_as_user={"value": 33}, run_as_group={"value": 50},
                                               supplemental_groups=[7, 5000])
    container_id = running(daemon, crictl, pod, config)
    user = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id),
                                            timeout=10).status.user.linux
    pid = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["info"]["pid"]
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f)
    assert (user.uid, user.gid) == (33, 50) == (int(status["Uid"].split()[0]), int(status["Gid"].split()[0]))
    assert sorted(user.supplemental_groups) == [7, 50, 5000] == sorted(int(g) for g in status["Groups"].split())
    # Without a process, the user it is given (its OCI spec's, as containerd reports it).
    daemon.crictl(crictl, "stop", "-t", "0", container_id)
    stopped = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id),
                                               timeout=10).status.user.linux
    assert (stopped.uid, stopped.gid, sorted(stopped.supplemental_groups)) == (33, 50, [7, 50, 5000])


def test_container_status_reports_the_user_of_a_container_not_started_yet(daemon, crictl, pod) -> None:
    config = container_config(["sleep", "600"])
    config["linux"]["security_context"].update(run_as_user={"value": 33}, run_as_group={"value": 50},
                                               supplemental_groups=[7])
    container_id = daemon.create_container(pod[0], config, pod[1])
    status = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id),
                                              timeout=10).status
    assert status.state == api_pb2.ContainerState.CONTAINER_CREATED
    assert (status.user.linux.uid, status.user.linux.gid, sorted(status.user.linux.supplemental_groups)) == \
        (33, 50, [7, 50])
