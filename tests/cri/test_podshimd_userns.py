"""A pod's user namespace (``userns_options`` mode POD, kubelet's ``hostUsers: false``) through
podshimd's gRPC: seen from inside (its uid_map, what root writes) and from outside (no process of
the host's root), the handler features Status reports, and the refusals."""

from __future__ import annotations

import json
import os

import pytest

from shim.cri.api import api_pb2

from support.podtools import container_config, pod_config
from support.shimtools import HANDLERS

HOST_ID = 2_000_000 + (os.getpid() % 500) * 65536  # a range no other test's pod is given
MAPPING = [{"container_id": 0, "host_id": HOST_ID, "length": 65536}]


def _userns_pod_config(**sysctls: str) -> dict:
    config = pod_config()
    if sysctls:
        config["linux"]["sysctls"] = {name.replace("_", ".", 2): value for name, value in sysctls.items()}
    namespace_options = config.setdefault("linux", {}).setdefault("security_context", {}).setdefault(
        "namespace_options", {})
    namespace_options["userns_options"] = {"mode": 0, "uids": MAPPING, "gids": MAPPING}
    return config


@pytest.fixture(params=HANDLERS)
def userns_pod(request, daemon, crictl, tmp_path) -> tuple[str, str]:
    path = tmp_path / "pod.json"
    # A sysctl of the pod's network namespace (CNI's, the host's user namespace's), which the
    # pod's root may not write.
    path.write_text(json.dumps(_userns_pod_config(net_ipv4_ip_unprivileged_port_start="80")))
    return daemon.crictl(crictl, "runp", "--runtime", request.param, str(path)).stdout.strip(), str(path)


def _exec(daemon, crictl, container_id: str, script: str) -> str:
    done = daemon.crictl(crictl, "exec", container_id, "sh", "-c", script, check=False)
    assert done.returncode == 0, done
    return done.stdout


def test_status_reports_user_namespaces_for_every_handler(daemon) -> None:
    status = daemon.runtime().Status(api_pb2.StatusRequest(), timeout=10)
    features = {h.name: h.features.user_namespaces for h in status.runtime_handlers}
    assert features == {"": True, **{name: True for name in HANDLERS}}


def test_a_container_runs_in_the_pods_user_namespace(daemon, crictl, userns_pod, tmp_path) -> None:
    pod_id, pod_path = userns_pod
    volume = tmp_path / "volume"
    volume.mkdir()
    config = container_config(["sleep", "600"])
    config["mounts"] = [{"container_path": "/volume", "host_path": str(volume)}]
    config["linux"] = {"security_context": {"namespace_options": {
        "userns_options": {"mode": 0, "uids": MAPPING, "gids": MAPPING}}}}
    container_id = daemon.create_container(pod_id, config, pod_path)
    daemon.crictl(crictl, "start", container_id)
    # Inside: root of a namespace of the pod's mapping.
    assert _exec(daemon, crictl, container_id, "cat /proc/self/uid_map").split() == ["0", str(HOST_ID), "65536"]
    assert _exec(daemon, crictl, container_id, "id -u").strip() == "0"
    # The image's files are root's inside (its layers are id-mapped), and what root writes in the
    # root is owned by the mapped root outside.
    assert _exec(daemon, crictl, container_id, "stat -c %u /bin/sh /etc /etc/hosts").split() == ["0", "0", "0"]
    _exec(daemon, crictl, container_id, "echo x > /written-by-root && touch /volume/file")
    inspect = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)
    pid = inspect["info"]["pid"]
    assert os.stat(f"/proc/{pid}/root/written-by-root").st_uid == HOST_ID
    # The volume is id-mapped: root inside writes root's file on the host's disk, as kubelet expects.
    assert os.stat(volume / "file").st_uid == 0
    # Outside: none of the container's processes has the host's root as any of its ids.
    for pid_dir in _pids_of(pid):
        with open(f"/proc/{pid_dir}/status") as f:
            uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
        assert set(uids) == {str(HOST_ID)}, (pid_dir, uids)


def test_an_exec_and_the_pods_namespaces_are_the_containers(daemon, crictl, userns_pod) -> None:
    pod_id, pod_path = userns_pod
    container_id = daemon.create_container(pod_id, container_config(["sleep", "600"]), pod_path)
    daemon.crictl(crictl, "start", container_id)
    pid = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["info"]["pid"]
    # An exec is in the container's namespaces, its network namespace (the pod's) among them.
    seen = _exec(daemon, crictl, container_id, "for n in net user ipc uts; do readlink /proc/self/ns/$n; done")
    assert seen.split() == [os.readlink(f"/proc/{pid}/ns/{kind}") for kind in ("net", "user", "ipc", "uts")]
    assert os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")
    # The pod's sysctl is written in its network namespace.
    assert _exec(daemon, crictl, container_id, "cat /proc/sys/net/ipv4/ip_unprivileged_port_start").strip() == "80"
    # /sys is the host's sysfs, read-only, without the host's mounts below it.
    assert _exec(daemon, crictl, container_id, "touch /sys/kernel/x 2>&1 || echo refused").strip().endswith("refused")
    mounts = _exec(daemon, crictl, container_id, "cat /proc/self/mountinfo").splitlines()
    sys_lines = [line.split() for line in mounts if line.split()[4] == "/sys"]
    assert len(sys_lines) == 1 and "ro" in sys_lines[0][5].split(","), sys_lines
    # Below /sys/fs/cgroup only the container's own cgroups (cgroup v1: its directory in each
    # hierarchy, as runc binds them), never the host's hierarchies.
    cgroups = [line.split() for line in mounts if line.split()[4].startswith("/sys/fs/cgroup/")]
    assert all(fields[3].rsplit("/", 1)[-1] == container_id for fields in cgroups), cgroups


def _pids_of(pid: int) -> list[int]:
    """``pid`` and the processes in its pid namespace."""
    ns = os.stat(f"/proc/{pid}/ns/pid").st_ino
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/pid").st_ino == ns:
                    found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("uids, sentence", [
    ([{"container_id": 1, "host_id": 100000, "length": 65536}], "must map from id 0 inside"),
    ([{"container_id": 0, "host_id": 0, "length": 65536}], "leave out the host's root"),
])
def test_mappings_kubelet_would_not_send_are_refused(daemon, crictl, tmp_path, uids, sentence) -> None:
    config = _userns_pod_config()
    config["linux"]["security_context"]["namespace_options"]["userns_options"]["uids"] = uids
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(config))
    done = daemon.crictl(crictl, "runp", str(path), check=False)
    assert done.returncode != 0 and sentence in done.stderr, done


def test_nothing_of_the_pod_is_left_once_it_is_removed(daemon, crictl, userns_pod) -> None:
    pod_id, pod_path = userns_pod
    container_id = daemon.create_container(pod_id, container_config(["sleep", "600"]), pod_path)
    daemon.crictl(crictl, "start", container_id)
    pid = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["info"]["pid"]
    user = os.stat(f"/proc/{pid}/ns/user").st_ino
    daemon.crictl(crictl, "stopp", pod_id)
    daemon.crictl(crictl, "rmp", pod_id)
    # No process holds the user namespace, and no mount of the container (its rootfs, over the
    # id-mapped layers) is left on the host.
    assert [p for p in os.listdir("/proc") if p.isdigit() and _user_ino(p) == user] == []
    with open("/proc/self/mountinfo") as f:
        assert [line for line in f if container_id in line or pod_id in line] == []


def _user_ino(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}/ns/user").st_ino
    except OSError:
        return 0


def test_a_privileged_pod_is_refused_a_user_namespace(daemon, crictl, tmp_path) -> None:
    config = _userns_pod_config()
    config["linux"]["security_context"]["privileged"] = True
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(config))
    done = daemon.crictl(crictl, "runp", str(path), check=False)
    assert done.returncode != 0 and "a privileged pod cannot have a user namespace" in done.stderr, done


def test_a_containers_host_devices_are_refused_in_a_user_namespace(daemon, crictl, userns_pod) -> None:
    pod_id, pod_path = userns_pod
    config = container_config(["sleep", "600"])
    config["devices"] = [{"container_path": "/dev/host-null", "host_path": "/dev/null", "permissions": "rwm"}]
    container_id = daemon.create_container(pod_id, config, pod_path)
    done = daemon.crictl(crictl, "start", container_id, check=False)
    assert done.returncode != 0 and "devices cannot be made in the pod's user namespace" in done.stderr, done


def test_container_status_reports_the_ids_as_the_container_sees_them(daemon, crictl, userns_pod) -> None:
    pod_id, pod_path = userns_pod
    config = container_config(["sleep", "600"])
    config["linux"]["security_context"].update(run_as_user={"value": 33}, run_as_group={"value": 50},
                                               supplemental_groups=[7])
    container_id = daemon.create_container(pod_id, config, pod_path)
    daemon.crictl(crictl, "start", container_id)
    pid = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["info"]["pid"]
    with open(f"/proc/{pid}/status") as f:
        assert next(line for line in f if line.startswith("Uid:")).split()[1] == str(HOST_ID + 33)
    # The host sees the mapped ids; the status says the container's own.
    user = daemon.runtime().ContainerStatus(api_pb2.ContainerStatusRequest(container_id=container_id),
                                            timeout=10).status.user.linux
    assert (user.uid, user.gid, sorted(user.supplemental_groups)) == (33, 50, [7, 50])
