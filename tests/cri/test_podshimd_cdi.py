"""CDI devices through podshimd's gRPC, on every runtime handler: a container's CDI_devices resolved
with the JSON and YAML CDI specs of the daemon's private spec directories (config ``cdi_spec_dirs``):
device nodes the test makes or the spec says, mounts and env applied; an unknown device and a broken
spec refused; hooks run at their points of the OCI lifecycle, a failing or late one failing the start."""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator

import grpc
import pytest

from support.critools import Podshimd, private_podshimd
from support.podtools import container_config, pod_config
from support.shimtools import HANDLERS


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


def test_a_cdi_device_gets_its_nodes_mounts_and_env(daemon, crictl, pod, spec_dirs, nodes, tmp_path) -> None:
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


def test_an_unknown_cdi_device_is_invalid_argument_naming_it(daemon, pod, spec_dirs) -> None:
    write_spec(spec_dirs[0], "vendor.json", {"kind": "example.com/gpu", "devices": [{"name": "gpu0",
                                                                                      "containerEdits": {}}]})
    error = create_error(daemon, pod, with_cdi("example.com/gpu=gpu7"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "CDI device 'example.com/gpu=gpu7' is not defined by any valid CDI spec" in error.details()
    error = create_error(daemon, pod, with_cdi("gpu7"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'gpu7' is not a fully qualified CDI device name (vendor.com/class=name)" in error.details()


def test_a_yaml_spec_makes_the_device_nodes_it_says(daemon, crictl, pod, spec_dirs, nodes) -> None:
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


def test_a_cdi_node_whose_owner_the_spec_does_not_say_is_the_container_users(daemon, crictl, pod, spec_dirs, nodes) -> None:
    write_spec(spec_dirs[0], "vendor.json", {"kind": "example.com/gpu", "devices": [{"name": "gpu0", "containerEdits": {
        "deviceNodes": [{"path": "/dev/gpu0", "hostPath": f"{nodes}/zero"}]}}]})
    config = with_cdi("example.com/gpu=gpu0")
    config["linux"] = {"security_context": {"run_as_user": {"value": 4321}}}
    container_id = daemon.create_container(pod[0], config, pod[1])
    daemon.crictl(crictl, "start", container_id)
    assert daemon.crictl(crictl, "exec", container_id, "stat", "-c", "%u", "/dev/gpu0").stdout == "4321\n"


def test_a_broken_spec_is_skipped_and_its_device_is_invalid_argument(daemon, pod, spec_dirs) -> None:
    with open(os.path.join(spec_dirs[1], "vendor.yaml"), "w") as f:
        f.write("cdiVersion: 9.9.9\nkind: example.com/yaml\ndevices:\n- name: y\n")
    error = create_error(daemon, pod, with_cdi("example.com/yaml=y"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "CDI device 'example.com/yaml=y' is not defined by any valid CDI spec" in error.details()
    assert "vendor.yaml was skipped: cdiVersion '9.9.9' is not a CDI version podshim knows" in error.details()


# -- hooks -----------------------------------------------------------------------------------------

#: What each hook writes to OUT/<point>.*: the state on its stdin, its mount namespace, its HOOKENV,
#: the config.json of the state's bundle.
HOOK = """#!/bin/sh
cat > "$1/$2.state"
readlink /proc/self/ns/mnt > "$1/$2.mnt"
echo "$HOOKENV" > "$1/$2.env"
bundle=$(sed -n 's/.*"bundle": *"\\([^"]*\\)".*/\\1/p' "$1/$2.state")
cp "$bundle/config.json" "$1/$2.config" 2>/dev/null || true
"""
OUT_IN_CONTAINER = "/hooks-out"


@pytest.fixture
def hook_dirs(tmp_path) -> tuple[str, str]:
    """(a directory with the hook program ``hook``, the directory the hooks write to), both
    reachable by the hooks of every point (the host's paths; the container sees them at /hooks and
    /hooks-out through the spec's mounts)."""
    bin_dir, out = tmp_path / "hooks", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    (bin_dir / "hook").write_text(HOOK)
    (bin_dir / "hook").chmod(0o755)
    # Each reads the state first (crun fails a hook that exits before it wrote it, in its own words).
    (bin_dir / "fail").write_text("#!/bin/sh\ncat > /dev/null\necho no gpu here >&2\nexit 3\n")
    (bin_dir / "fail").chmod(0o755)
    # (its pid as the node's /proc says it, which a hook in the container's pid namespace sees before the pivot too)
    (bin_dir / "slow").write_text("#!/bin/sh\ncat > /dev/null\nread pid rest < /proc/self/stat\n"
                                  "echo $pid > \"$1/slow.pid\"\nexec sleep 60\n")
    (bin_dir / "slow").chmod(0o755)
    os.chmod(out, 0o777)
    return str(bin_dir), str(out)


def hook_spec(directory: str, hook_dirs: tuple[str, str], hooks: list[dict]) -> None:
    bin_dir, out = hook_dirs
    write_spec(directory, "hooks.json", {"kind": "example.com/hook", "devices": [{"name": "h", "containerEdits": {
        "mounts": [{"hostPath": bin_dir, "containerPath": "/hooks", "options": ["rbind", "ro"]},
                   {"hostPath": out, "containerPath": OUT_IN_CONTAINER, "options": ["rbind"]}],
        "hooks": hooks}}]})


def test_cdi_hooks_run_at_their_points_with_the_state(daemon, crictl, pod, spec_dirs, hook_dirs) -> None:
    bin_dir, out = hook_dirs
    on_host = [{"hookName": point, "path": f"{bin_dir}/hook", "args": ["hook", out, point], "env": [f"HOOKENV={point}"],
                "timeout": 10} for point in ("createRuntime", "createContainer", "poststart", "poststop")]
    in_container = {"hookName": "startContainer", "path": "/hooks/hook", "args": ["hook", OUT_IN_CONTAINER,
                                                                                 "startContainer"]}
    hook_spec(spec_dirs[0], hook_dirs, [*on_host, in_container])
    config = with_cdi("example.com/hook=h")
    # The program sees which hooks ran before it did.
    config["command"] = ["sh", "-c", f"ls {OUT_IN_CONTAINER} > {OUT_IN_CONTAINER}/program.saw; exec sleep 600"]
    container_id = daemon.create_container(pod[0], config, pod[1])
    assert os.listdir(out) == []  # nothing runs at create: the container is made at start
    daemon.crictl(crictl, "start", container_id)
    container_mnt = daemon.crictl(crictl, "exec", container_id, "readlink", "/proc/self/ns/mnt").stdout.strip()

    def read(name: str) -> str:
        with open(os.path.join(out, name)) as f:
            return f.read()

    for _ in range(400):  # the program writes its file right after its start
        if os.path.exists(os.path.join(out, "program.saw")) and read("program.saw"):
            break
        time.sleep(0.05)
    saw = read("program.saw").split()
    assert {"createRuntime.state", "createContainer.state", "startContainer.state"} <= set(saw)
    assert "poststop.state" not in saw
    states = {point: json.loads(read(f"{point}.state")) for point in ("createRuntime", "createContainer",
                                                                        "startContainer", "poststart")}
    for point, state in states.items():
        assert state["ociVersion"] and state["id"] and state["bundle"], (point, state)
    # Before the program runs (the runtimes differ: runc says created from createContainer on, crun from
    # createRuntime on and starting at startContainer; podshim's native handler the specification's creating, created).
    for point in ("createRuntime", "createContainer", "startContainer"):
        assert states[point]["status"] in ("creating", "created", "starting"), (point, states[point])
    assert states["createRuntime"]["pid"] > 0
    # createRuntime and poststart in the runtime's namespace, createContainer and startContainer in the container's
    assert read("createRuntime.mnt").strip() != container_mnt
    assert read("poststart.mnt").strip() != container_mnt
    assert read("createContainer.mnt").strip() == container_mnt
    assert read("startContainer.mnt").strip() == container_mnt
    assert read("createContainer.env") == "createContainer\n"  # the hook's own env
    # The bundle's config.json says the container's root, which a hook finds the container by.
    root = json.loads(read("createContainer.config"))["root"]["path"]
    assert os.path.isabs(root) and root.endswith("/rootfs"), root
    assert not os.path.exists(os.path.join(out, "poststop.state"))
    daemon.crictl(crictl, "stop", "-t", "0", container_id)
    assert not os.path.exists(os.path.join(out, "poststop.state"))
    daemon.crictl(crictl, "rm", container_id)
    assert json.loads(read("poststop.state"))["id"] == states["createRuntime"]["id"]


@pytest.mark.parametrize("point", ["createRuntime", "createContainer"])
def test_a_failing_cdi_hook_fails_the_start_with_its_words(daemon, crictl, pod, spec_dirs, hook_dirs, point) -> None:
    bin_dir, out = hook_dirs
    hook_spec(spec_dirs[0], hook_dirs, [{"hookName": point, "path": f"{bin_dir}/fail"}])
    container_id = daemon.create_container(pod[0], with_cdi("example.com/hook=h"), pod[1])
    started = daemon.crictl(crictl, "start", container_id, check=False)
    assert started.returncode != 0
    assert "code = FailedPrecondition" in started.stderr, started.stderr
    assert "hook" in started.stderr, started.stderr  # (crun names it, runc numbers it)
    assert "exit status 3" in started.stderr or "exit code: 3" in started.stderr, started.stderr
    status = json.loads(daemon.crictl(crictl, "inspect", container_id).stdout)["status"]
    assert status["state"] != "CONTAINER_RUNNING"
    daemon.crictl(crictl, "rm", container_id)


@pytest.mark.parametrize("point", ["createRuntime", "createContainer"])
def test_a_cdi_hook_past_its_timeout_is_killed_and_fails_the_start(daemon, crictl, pod, spec_dirs, hook_dirs, point) -> None:
    bin_dir, out = hook_dirs
    hook_spec(spec_dirs[0], hook_dirs, [{"hookName": point, "path": f"{bin_dir}/slow",
                                         "args": ["slow", out], "timeout": 1}])
    container_id = daemon.create_container(pod[0], with_cdi("example.com/hook=h"), pod[1])
    began = time.monotonic()
    started = daemon.crictl(crictl, "start", container_id, check=False)
    assert started.returncode != 0
    assert time.monotonic() - began < 8
    # (native and runc say the timeout; crun, for a createContainer hook, that it was killed: exit code -1)
    assert "code = FailedPrecondition" in started.stderr and "hook" in started.stderr, started.stderr
    with open(os.path.join(out, "slow.pid")) as f:
        pid = int(f.read())
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), "the hook was not killed"
    daemon.crictl(crictl, "rm", container_id)
