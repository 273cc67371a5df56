"""podshimctl's crictl-shaped verbs as a client of podshimd (the one writer of the pod store):
what each prints, what a user is told with no daemon running, errors as one sentence, and the
shim-level verbs never importing gRPC."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from support.critools import REPO
from support.podtools import container_config, pod_config
from support.proctools import wait_gone

PODSHIMCTL = [sys.executable, "-m", "client.cli"]


def ctl(daemon, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """podshimctl with the daemon's runtime root (so its default endpoint is the daemon's socket)."""
    result = subprocess.run([*PODSHIMCTL, "--runtime-root", daemon.runtime_root, *argv], cwd=REPO,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture
def files(daemon, tmp_path):
    pod, container = tmp_path / "pod.json", tmp_path / "container.json"
    pod.write_text(json.dumps(pod_config()))
    config = container_config(["/bin/sh", "-c", "echo $GREETING from $(hostname)"], pid=0)
    # An env value is CRI bytes since 1.37: crictl's files write it as text, and text it stays
    # ("abcd" is valid base64 too).
    config["envs"] = [{"key": "GREETING", "value": "hello"}, {"key": "TEXT", "value": "abcd"}]
    config["image"] = {"image": daemon.image}
    container.write_text(json.dumps(config))
    return str(pod), str(container)


def test_a_pod_and_a_container_through_podshimctl(daemon, crictl, files) -> None:
    pod_file, container_file = files
    pod_id = ctl(daemon, "runp", pod_file).stdout.strip()
    container_id = ctl(daemon, "create", pod_id[:10], container_file, pod_file).stdout.strip()
    assert ctl(daemon, "start", container_id[:10]).stdout == f"{container_id[:10]}\n"
    status = json.loads(ctl(daemon, "inspect", "--json", container_id).stdout)
    assert not wait_gone(status["info"]["pid"])
    assert ctl(daemon, "logs", container_id).stdout == "hello from podshim-demo\n"
    pods = ctl(daemon, "pods").stdout.splitlines()
    assert pods[0].split() == ["POD", "ID", "CREATED", "AT", "STATE", "NAME", "NAMESPACE", "ATTEMPT", "RUNTIME", "IP"]
    with open(pod_file) as f:
        name = json.load(f)["metadata"]["name"]
    assert pods[1].split()[0] == pod_id[:13] and pods[1].split()[2:5] == ["READY", name, "default"]
    listed = json.loads(ctl(daemon, "ps", "-a", "--json").stdout)
    assert [(c["id"], c["state"], c["exit_code"]) for c in listed] == [(container_id, "CONTAINER_EXITED", 0)]
    assert ctl(daemon, "ps", "-q").stdout == ""  # running ones only
    # crictl's table: the image and the pod's name too.
    table = ctl(daemon, "ps", "-a").stdout.splitlines()
    assert table[0].split() == ["CONTAINER", "IMAGE", "CREATED", "AT", "STATE", "NAME", "ATTEMPT", "POD", "ID", "POD",
                                "EXIT", "CODE"]
    with open(container_file) as f:
        container_name = json.load(f)["metadata"]["name"]
    row = table[1].split()
    assert (row[:2], row[3:]) == ([container_id[:13], daemon.image],
                                  ["EXITED", container_name, "0", pod_id[:13], name, "0"]), table
    found = json.loads(ctl(daemon, "inspectp", "--json", pod_id).stdout)
    assert found["state"] == "SANDBOX_READY" and found["info"]["netns_path"] == found["info"]["shim"]["netns_path"]
    # What podshimctl did, crictl sees: one store, one writer.
    assert daemon.crictl(crictl, "ps", "-qa").stdout.split() == [container_id]
    assert ctl(daemon, "stopp", pod_id).stdout == f"Stopped sandbox {pod_id}\n"
    assert ctl(daemon, "rmp", pod_id).stdout == f"Removed sandbox {pod_id}\n"
    assert ctl(daemon, "pods", "-q").stdout == "" and daemon.crictl(crictl, "pods", "-q").stdout == ""
    assert not os.path.exists(found["info"]["netns_path"])


def test_pods_filters_and_stop_with_a_timeout(daemon, files, tmp_path) -> None:
    pod_file, _ = files
    pod_id = ctl(daemon, "runp", pod_file).stdout.strip()
    stubborn = tmp_path / "stubborn.json"
    stubborn.write_text(json.dumps({**container_config(["/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done"],
                                                       pid=0), "image": {"image": daemon.image}}))
    container_id = ctl(daemon, "create", pod_id, str(stubborn), pod_file).stdout.strip()
    ctl(daemon, "start", container_id)
    assert ctl(daemon, "pods", "-q", "--state", "ready", "--label", "app=podshim-demo").stdout.split() == [pod_id]
    assert ctl(daemon, "pods", "-q", "--state", "notready").stdout == ""
    assert ctl(daemon, "stop", "--timeout", "1", container_id).stdout == f"{container_id}\n"
    status = json.loads(ctl(daemon, "inspect", "--json", container_id).stdout)
    assert (status["state"], status["exit_code"]) == ("CONTAINER_EXITED", 137)


def test_errors_are_the_status_and_the_daemons_sentence(daemon, tmp_path) -> None:
    unknown = ctl(daemon, "inspectp", "nosuchpod", check=False)
    assert unknown.returncode == 1
    assert unknown.stderr == "NOT_FOUND: no pod sandbox has an id starting with 'nosuchpod'\n"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"metadata": {"name": "x", "namespace": "y"}}))
    invalid = ctl(daemon, "runp", str(bad), check=False)
    assert (invalid.returncode, invalid.stderr) == (1, "INVALID_ARGUMENT: metadata.uid is required\n")
    bad.write_text('{"metadata": {"name": 1}}')
    wrong_type = ctl(daemon, "runp", str(bad), check=False)
    assert wrong_type.returncode == 1 and wrong_type.stderr.startswith(f"podshimctl: pod config {bad} is not a CRI ")
    bad.write_text(json.dumps({**pod_config(), "linux": {"cgroup_parnet": "/kubepods"}}))  # a typo: no field
    misspelt = ctl(daemon, "runp", str(bad), check=False)
    assert misspelt.returncode == 1 and "cgroup_parnet" in misspelt.stderr
    assert misspelt.stderr.startswith(f"podshimctl: pod config {bad} is not a CRI PodSandboxConfig: ")
    bad.write_text("{not json")
    not_json = ctl(daemon, "runp", str(bad), check=False)
    assert not_json.returncode == 1 and not_json.stderr.startswith("podshimctl: ")
    assert ctl(daemon, "pods", "-q").stdout == ""


def test_with_no_daemon_running_a_verb_says_how_to_start_one(tmp_path) -> None:
    result = subprocess.run([*PODSHIMCTL, "--runtime-root", str(tmp_path), "pods"], cwd=REPO,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == (f"podshimctl: podshimd is not running: nothing at {tmp_path}/podshimd.sock; start it "
                             "with `systemctl start podshimd` (systemd/podshimd.service), or run `podshimd` as root "
                             "(it stays in the foreground)\n")
    dead = tmp_path / "podshimd.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(dead))  # a socket file nobody listens on: what a killed daemon leaves
    result = subprocess.run([*PODSHIMCTL, "ps", "--endpoint", f"unix://{dead}"], cwd=REPO,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith(f"podshimctl: podshimd is not running: nothing answers on unix://{dead}; start it")


def test_the_shim_level_verbs_never_import_grpc() -> None:
    probe = ("import sys; from client.cli.main import build_parser; build_parser(); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google') or 'criapi' in m))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout == "[]\n"


def test_the_pod_verbs_import_neither_grpc_nor_asyncio(daemon) -> None:
    # grpcio's import (asyncio and grpc.aio with it) was half of a verb's start-up (issue #15):
    # podshimctl speaks gRPC to podshimd through shim.grpcwire.
    probe = ("import sys; from client.cli.main import main; code = main(sys.argv[1:]); "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'grpc', 'asyncio'}), code, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", probe, "--runtime-root", daemon.runtime_root, "pods"], cwd=REPO,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith("POD ID") and result.stderr == "[] 0\n"
