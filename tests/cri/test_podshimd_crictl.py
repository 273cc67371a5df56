"""podshimd as the real crictl sees it: version, info, UNIMPLEMENTED for what it lacks; its socket's
life (0600 in 0700, one daemon per socket, stale sockets replaced, removed at SIGTERM); its errors."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile

import grpc
import pytest

from shim.cri.api import api_pb2

from client.podshimd import checkpoints

from support.critools import podshimd_argv, running_podshimd

BRIDGE_CONFLIST = {
    "cniVersion": "1.0.0", "name": "podshim-test",
    "plugins": [{"type": "bridge", "bridge": "ps0", "ipam": {"type": "host-local", "subnet": "10.99.0.0/24"}}],
}


@pytest.fixture
def directory():
    """A private directory for one daemon (short: the socket path must fit sun_path); removed after."""
    path = tempfile.mkdtemp(prefix="podshimd-")
    yield path
    shutil.rmtree(path)


@pytest.fixture
def daemon(directory):
    with running_podshimd(directory) as d:
        yield d


def run_podshimd(directory: str, *extra: str, config: str = "") -> subprocess.CompletedProcess:
    """Run podshimd to its exit (for start-up errors); the daemon is killed if it serves instead."""
    with open(os.path.join(directory, "config.toml"), "w") as f:
        f.write(config)
    return subprocess.run(podshimd_argv(directory, *extra), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=30)


def fields(output: str) -> dict[str, str]:
    """crictl version's "Key:  value" lines."""
    return dict((k.strip(), v.strip()) for k, v in (line.split(":", 1) for line in output.splitlines() if ":" in line))


def conditions(info: str) -> dict[str, dict]:
    return {c["type"]: c for c in json.loads(info)["status"]["conditions"]}


def assert_one_sentence(stderr: str, starts: str) -> None:
    assert stderr.startswith(starts) and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr


# -- what crictl sees ------------------------------------------------------------------------------

def test_crictl_version_says_podshim_speaking_cri_v1(daemon, crictl) -> None:
    out = fields(daemon.crictl(crictl, "version").stdout)
    assert out == {"Version": "0.1.0", "RuntimeName": "podshim", "RuntimeVersion": "0.1.0", "RuntimeApiVersion": "v1"}


def test_crictl_info_runtime_ready_network_not_ready_without_cni_config(daemon, crictl) -> None:
    found = conditions(daemon.crictl(crictl, "info").stdout)
    assert found["RuntimeReady"]["status"] is True
    network = found["NetworkReady"]
    assert network["status"] is False and network["reason"] == "NetworkPluginNotReady"
    assert network["message"] == f"no CNI network config found in {daemon.cni_conf_dir}"


def test_crictl_info_network_ready_once_a_cni_config_exists(daemon, crictl) -> None:
    os.makedirs(daemon.cni_conf_dir)
    with open(os.path.join(daemon.cni_conf_dir, "10-test.conflist"), "w") as f:
        json.dump(BRIDGE_CONFLIST, f)
    network = conditions(daemon.crictl(crictl, "info").stdout)["NetworkReady"]
    assert network["status"] is True and network["reason"] == ""


def test_crictl_info_network_not_ready_with_an_invalid_cni_config(daemon, crictl) -> None:
    os.makedirs(daemon.cni_conf_dir)
    path = os.path.join(daemon.cni_conf_dir, "10-bad.conf")
    with open(path, "w") as f:
        f.write('{"cniVersion": "1.0.0"}')
    network = conditions(daemon.crictl(crictl, "info").stdout)["NetworkReady"]
    assert network["status"] is False and network["reason"] == "NetworkPluginNotReady"
    assert network["message"] == f"the CNI network config is not valid: {path}: name must be a non-empty string"


def test_crictl_info_shows_the_config_in_effect(daemon, crictl) -> None:
    config = json.loads(daemon.crictl(crictl, "info").stdout)["config"]
    assert config["state_root"] == daemon.state_root and config["listen"] == daemon.endpoint
    assert config["runtime_handlers"] == ["native", "runc", "crun"]


def test_methods_not_implemented_yet_answer_unimplemented_with_a_sentence(daemon) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        daemon.runtime().CheckpointContainer(api_pb2.CheckpointContainerRequest(container_id="x"))
    assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert failed.value.details() == ("CheckpointContainer is not supported: podshim cannot checkpoint or restore "
                                      f"processes ({checkpoints.criu_state()})")


# -- the socket ------------------------------------------------------------------------------------

def test_socket_is_0600_in_a_0700_directory(daemon) -> None:
    st = os.lstat(daemon.socket_path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(daemon.runtime_root).st_mode) == 0o700


def test_sigterm_stops_the_daemon_and_removes_its_socket(directory, crictl) -> None:
    with running_podshimd(directory) as daemon:
        daemon.crictl(crictl, "version")
        assert daemon.stop() == 0
        assert not os.path.exists(daemon.socket_path)
        assert "Traceback" not in daemon.log()


def test_a_second_daemon_on_the_same_socket_is_refused_and_the_first_keeps_serving(daemon, crictl) -> None:
    second = run_podshimd(daemon.directory)
    assert second.returncode == 1
    # Same state root and socket: the state root's lock is the one it meets first.
    assert_one_sentence(second.stderr, f"podshimd: another podshimd (pid {daemon.process.pid}) serves the state "
                                       f"root {daemon.state_root}: ")
    assert fields(daemon.crictl(crictl, "version").stdout)["RuntimeName"] == "podshim"


def test_another_live_server_on_the_socket_is_refused(directory) -> None:
    run = os.path.join(directory, "run")
    os.makedirs(run, 0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(os.path.join(run, "podshimd.sock"))
        other.listen(1)
        result = run_podshimd(directory)
        assert result.returncode == 1
        assert_one_sentence(result.stderr, f"podshimd: another daemon already answers on unix://{run}/podshimd.sock")
        assert os.path.exists(os.path.join(run, "podshimd.sock"))  # not taken from its owner


def test_a_stale_socket_is_replaced(directory, crictl) -> None:
    run = os.path.join(directory, "run")
    os.makedirs(run, 0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(os.path.join(run, "podshimd.sock"))  # bound, never listening: what a killed daemon leaves
    with running_podshimd(directory) as daemon:
        assert fields(daemon.crictl(crictl, "version").stdout)["RuntimeName"] == "podshim"


def test_a_shared_directory_for_the_socket_is_refused(directory) -> None:
    shared = os.path.join(directory, "shared")
    os.makedirs(shared)
    os.chmod(shared, 0o1777)
    result = run_podshimd(directory, "--listen", f"unix://{shared}/podshimd.sock")
    assert result.returncode == 1
    assert_one_sentence(result.stderr, f"podshimd: the socket directory {shared} has mode 1777, not 0700")
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777


def test_a_symlink_planted_at_the_socket_directory_is_refused_and_its_target_left_alone(directory) -> None:
    elsewhere = os.path.join(directory, "elsewhere")
    os.makedirs(elsewhere)
    os.chmod(elsewhere, 0o755)
    os.symlink(elsewhere, os.path.join(directory, "run"))
    result = run_podshimd(directory)
    assert result.returncode == 1
    assert_one_sentence(result.stderr, f"podshimd: cannot use the socket directory {directory}/run: "
                                       f"{directory}/run is a symbolic link")
    assert stat.S_IMODE(os.stat(elsewhere).st_mode) == 0o755 and os.listdir(elsewhere) == []


# -- refusing to start -----------------------------------------------------------------------------

def test_a_bad_config_file_exits_1_with_one_sentence(directory) -> None:
    result = run_podshimd(directory, config='listen = "tcp://127.0.0.1:1"\n')
    assert result.returncode == 1
    assert_one_sentence(result.stderr, f"podshimd: {directory}/config.toml: listen: must be a unix:///ABSOLUTE/PATH")


def test_the_systemd_cgroup_driver_is_refused_at_start_on_a_machine_without_systemd_as_init(directory) -> None:
    assert not os.path.isdir("/run/systemd/system")  # this machine's init is not systemd; the guest tests run it
    result = run_podshimd(directory, config='cgroup_driver = "systemd"\n')
    assert result.returncode == 1
    assert_one_sentence(result.stderr, f"podshimd: {directory}/config.toml: cgroup_driver: the systemd cgroup driver "
                                       "needs systemd as the init of this machine, which it is not "
                                       "(no /run/systemd/system): use cgroupfs")


def test_bad_toml_exits_1_with_one_sentence(directory) -> None:
    result = run_podshimd(directory, config="template = \n")
    assert result.returncode == 1
    assert_one_sentence(result.stderr, f"podshimd: {directory}/config.toml: bad TOML syntax: ")


def test_a_bad_flag_value_exits_1_with_one_sentence(directory) -> None:
    result = run_podshimd(directory, "--state-root", "relative/state")
    assert result.returncode == 1
    assert result.stderr == "podshimd: command line: --state-root: must be an absolute path, not 'relative/state'\n"


def test_a_usage_error_exits_2(directory) -> None:
    result = run_podshimd(directory, "--no-such-flag")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "unrecognized arguments: --no-such-flag" in result.stderr
