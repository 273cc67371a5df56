"""CDI devices through podshimd's gRPC, on every runtime handler: a container's CDI_devices resolved
with the JSON and YAML CDI specs of the daemon's private spec directories (config ``cdi_spec_dirs``):
device nodes the test makes or the spec says, mounts and env applied; an unknown device and a broken
spec refused."""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from collections.abc import Iterator

import grpc
import pytest

from support.critools import Podshimd, private_podshimd
from support.podtools import container_config, pod_config

HANDLERS = ["native"] + [h for h in ("runc", "crun") if shutil.which(h, path="/usr/sbin:/usr/bin:/sbin:/bin")]


@pytest.fixture(scope="module")
def cdi_root() -> Iterator[str]:
    """A private directory to hold the daemon's CDI spec directories (made by each test)."""
    path = tempfile.mkdtemp(prefix="psd-cdi-specs-")
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def module_daemon(test_images, cdi_root) -> Iterator[Podshimd]:
    """A podshimd whose CDI spec directories are ``<cdi_root>/etc-cdi``, then ``<cdi_root>/run-cdi``."""
    dirs = [os.path.join(cdi_root, "etc-cdi"), os.path.join(cdi_root, "run-cdi")]
    with private_podshimd("psd-cdi-", test_images.busybox, config=f"cdi_spec_dirs = {json.dumps(dirs)}\n") as daemon:
        yield daemon


@pytest.fixture
def spec_dirs(cdi_root) -> Iterator[tuple[str, str]]:
    """The daemon's two CDI spec directories, made empty for the test and removed after it."""
    dirs = (os.path.join(cdi_root, "etc-cdi"), os.path.join(cdi_root, "run-cdi"))
    for path in dirs:
        os.makedirs(path)
    yield dirs
    for path in dirs:
        shutil.rmtree(path)


@pytest.fixture
def nodes(tmp_path) -> str:
    """A directory with device nodes the test makes: ``zero`` (1:5) and ``null`` (1:3)."""
    path = tmp_path / "nodes"
    path.mkdir()
    os.mknod(path / "zero", 0o666 | 0o020000, os.makedev(1, 5))
    os.mknod(path / "null", 0o666 | 0o020000, os.makedev(1, 3))
    return str(path)


@pytest.fixture(params=HANDLERS)
def pod(request, daemon, crictl, tmp_path) -> tuple[str, str]:
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod_config()))
    return daemon.crictl(crictl, "runp", "--runtime", request.param, str(path)).stdout.strip(), str(path)


def write_spec(directory: str, name: str, spec: dict) -> None:
    with open(os.path.join(directory, name), "w") as f:
        json.dump({"cdiVersion": "0.6.0", **spec}, f)


def with_cdi(*names: str) -> dict:
    config = container_config(["sleep", "600"])
    config["envs"] = [{"key": "WHO", "value": base64.b64encode(b"config").decode()}]  # bytes in protobuf's JSON
    config["CDI_devices"] = [{"name": name} for name in names]
    return config


def create_error(daemon, pod, config: dict) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        daemon.create_container(pod[0], config, pod[1])
    return raised.value


def test_a_cdi_device_gets_its_nodes_mounts_and_env(daemon, crictl, pod, spec_dirs, nodes, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "file").write_text("from the spec\n")
    write_spec(spec_dirs[0], "vendor.json", {
        "kind": "example.com/gpu",
        "containerEdits": {"env": ["VENDOR=example"]},
        "devices": [
            {"name": "gpu0", "containerEdits": {
                "env": ["WHO=gpu0", "GPU=0"],
                "deviceNodes": [{"path": "/dev/gpu0", "hostPath": f"{nodes}/zero", "permissions": "rw"}],
                "mounts": [{"hostPath": str(shared), "containerPath": "/opt/gpu", "options": ["rbind", "ro"]}]}},
            {"name": "gpu1", "containerEdits": {
                "deviceNodes": [{"path": "/dev/gpu1", "hostPath": f"{nodes}/null"}]}},
        ]})
    container_id = daemon.create_container(pod[0], with_cdi("example.com/gpu=gpu0"), pod[1])
    daemon.crictl(crictl, "start", container_id)

    def run(script: str) -> str:
        return daemon.crictl(crictl, "exec", container_id, "sh", "-c", script).stdout

    assert run("head -c 3 /dev/gpu0 | od -An -tx1").split() == ["00", "00", "00"]
    assert run("ls /dev/gpu1 2>/dev/null; echo .").strip() == "."  # a device not asked for is not there
    assert run("cat /opt/gpu/file") == "from the spec\n"
    assert "Read-only" in daemon.crictl(crictl, "exec", container_id, "sh", "-c", "touch /opt/gpu/x 2>&1",
                                        check=False).stdout
    assert run("echo $VENDOR $WHO $GPU").split() == ["example", "gpu0", "0"]


def test_a_spec_of_the_later_directory_overrides_the_earlier(daemon, crictl, pod, spec_dirs, nodes):
    device = {"kind": "example.com/gpu", "devices": [{"name": "gpu0", "containerEdits": {"env": ["FROM=etc"]}}]}
    write_spec(spec_dirs[0], "a.json", device)
    device["devices"][0]["containerEdits"]["env"] = ["FROM=run"]
    write_spec(spec_dirs[1], "a.json", device)
    container_id = daemon.create_container(pod[0], with_cdi("example.com/gpu=gpu0"), pod[1])
    daemon.crictl(crictl, "start", container_id)
    assert daemon.crictl(crictl, "exec", container_id, "sh", "-c", "echo $FROM").stdout == "run\n"


def test_an_unknown_cdi_device_is_invalid_argument_naming_it(daemon, pod, spec_dirs):
    write_spec(spec_dirs[0], "vendor.json", {"kind": "example.com/gpu", "devices": [{"name": "gpu0",
                                                                                      "containerEdits": {}}]})
    error = create_error(daemon, pod, with_cdi("example.com/gpu=gpu7"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "CDI device 'example.com/gpu=gpu7' is not defined by any valid CDI spec" in error.details()
    error = create_error(daemon, pod, with_cdi("gpu7"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'gpu7' is not a fully qualified CDI device name (vendor.com/class=name)" in error.details()


def test_a_yaml_spec_makes_the_device_nodes_it_says(daemon, crictl, pod, spec_dirs, nodes):
    """A YAML spec (as nvidia-ctk and DRA drivers write them): one node from a host node, one said
    by its type and numbers alone (no node on the host), with the mode and owner the spec says."""
    with open(os.path.join(spec_dirs[1], "vendor.yaml"), "w") as f:
        f.write(f"""\
---
cdiVersion: 0.5.0
kind: example.com/yaml
devices:
- name: y
  containerEdits:
    env: [FROM=yaml]
    deviceNodes:
    - path: /dev/yaml0
      hostPath: {nodes}/null
      permissions: rw
    - path: /dev/yaml1
      hostPath: {nodes}/absent
      type: c
      major: 1
      minor: 5
      fileMode: 0640
      uid: 1234
      gid: 5678
""")
    container_id = daemon.create_container(pod[0], with_cdi("example.com/yaml=y"), pod[1])
    daemon.crictl(crictl, "start", container_id)

    def run(script: str) -> str:
        return daemon.crictl(crictl, "exec", container_id, "sh", "-c", script).stdout

    assert run("echo $FROM") == "yaml\n"
    assert run("echo hi > /dev/yaml0 && echo written") == "written\n"
    assert run("stat -c '%F %t:%T %a %u:%g' /dev/yaml1").strip() == "character special file 1:5 640 1234:5678"
    assert run("head -c 2 /dev/yaml1 | od -An -tx1").split() == ["00", "00"]


def test_a_broken_spec_is_skipped_and_its_device_is_invalid_argument(daemon, pod, spec_dirs):
    with open(os.path.join(spec_dirs[1], "vendor.yaml"), "w") as f:
        f.write("cdiVersion: 9.9.9\nkind: example.com/yaml\ndevices:\n- name: y\n")
    error = create_error(daemon, pod, with_cdi("example.com/yaml=y"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "CDI device 'example.com/yaml=y' is not defined by any valid CDI spec" in error.details()
    assert "vendor.yaml was skipped: cdiVersion '9.9.9' is not a CDI version podshim knows" in error.details()
