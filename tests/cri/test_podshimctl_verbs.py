"""podshimctl's crictl-grade verbs and outputs against podshimd: logs -f/--tail/--since, version and
--version, info, update, -o json|yaml for the lists, inspect verbs as JSON, errors under --json as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from test_podshimd_podshimctl import PODSHIMCTL, ctl

from support.critools import REPO
from support.podtools import cgroup_file, container_config, pod_config


@pytest.fixture
def pod(daemon, tmp_path):
    """pod.run(command, **config) -> the id of a running container in one ready pod (pod.id, pod.path)."""
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod_config()))

    class Pod:
        id = ctl(daemon, "runp", str(path)).stdout.strip()

        @staticmethod
        def run(command: list[str], **extra) -> str:
            config = tmp_path / "container.json"
            config.write_text(json.dumps({**container_config(command), "image": {"image": daemon.image}, **extra}))
            container_id = ctl(daemon, "create", Pod.id, str(config), str(path)).stdout.strip()
            ctl(daemon, "start", container_id)
            return container_id
    return Pod


def wait_exited(daemon, container_id: str) -> None:
    deadline = time.monotonic() + 30
    while json.loads(ctl(daemon, "inspect", "--json", container_id).stdout)["state"] != "CONTAINER_EXITED":
        assert time.monotonic() < deadline, "the container did not exit"
        time.sleep(0.2)


def test_logs_tail_and_since(daemon, pod) -> None:
    container_id = pod.run(["sh", "-c", "for i in 1 2 3 4 5; do echo line $i; done"])
    wait_exited(daemon, container_id)
    assert ctl(daemon, "logs", "--tail", "2", container_id).stdout == "line 4\nline 5\n"
    assert ctl(daemon, "logs", "--tail", "0", container_id).stdout == ""
    assert ctl(daemon, "logs", "--since", "1h", container_id).stdout.count("line") == 5
    assert ctl(daemon, "logs", "--since", "2999-01-01T00:00:00Z", container_id).stdout == ""
    stamped = ctl(daemon, "logs", "-t", "--tail", "1", container_id).stdout
    assert stamped.endswith(" line 5\n") and stamped.startswith("20")
    bad = ctl(daemon, "logs", "--since", "yesterday", container_id, check=False)
    assert bad.returncode == 1 and "--since 'yesterday' is neither" in bad.stderr


def test_logs_f_follows_until_the_container_exits(daemon, pod) -> None:
    container_id = pod.run(["sh", "-c", "echo first; sleep 2; echo second; sleep 1; echo third"])
    started = time.monotonic()
    followed = ctl(daemon, "logs", "-f", container_id)
    assert followed.stdout == "first\nsecond\nthird\n"
    assert time.monotonic() - started >= 2  # it waited for what came later


def test_version_of_the_daemon_and_of_each_program(daemon) -> None:
    shown = ctl(daemon, "version").stdout
    assert "RuntimeName:  podshim\n" in shown and "RuntimeApiVersion:  v1\n" in shown
    assert json.loads(ctl(daemon, "version", "--json").stdout)["runtime_name"] == "podshim"
    for module, name in (("client.cli", "podshimctl"), ("client.podshimd", "podshimd")):
        done = subprocess.run([sys.executable, "-m", module, "--version"], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0 and done.stdout.startswith(f"{name} "), done
    done = subprocess.run([sys.executable, "-c", "import sys; from shim.cli import main; sys.exit(main())",
                           "--version"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("podshim "), done


def test_info_is_the_status_and_the_effective_configuration(daemon) -> None:
    info = json.loads(ctl(daemon, "info").stdout)
    assert {c["type"] for c in info["status"]["conditions"]} == {"RuntimeReady", "NetworkReady"}
    assert info["config"]["runtime_root"] == daemon.runtime_root
    assert "native" in [h["name"] for h in info["runtime_handlers"]]


def test_update_changes_a_running_containers_memory_limit(daemon, pod) -> None:
    container_id = pod.run(["sleep", "600"])
    assert ctl(daemon, "update", "--memory", "64m", container_id).stdout == f"{container_id}\n"
    pid = json.loads(ctl(daemon, "inspect", "--json", container_id).stdout)["info"]["pid"]
    with open(cgroup_file(pid, "memory", "memory.limit_in_bytes")) as f:
        assert int(f.read()) == 64 << 20
    nothing = ctl(daemon, "update", container_id, check=False)
    assert nothing.returncode == 1 and nothing.stderr.startswith("podshimctl: update: give at least one of")


def test_lists_as_crictl_json_and_yaml(daemon, pod) -> None:
    container_id = pod.run(["sleep", "600"])
    assert [p["id"] for p in json.loads(ctl(daemon, "pods", "-o", "json").stdout)["items"]] == [pod.id]
    assert [c["id"] for c in json.loads(ctl(daemon, "ps", "-o", "json").stdout)["containers"]] == [container_id]
    assert json.loads(ctl(daemon, "images", "-o", "json").stdout)["images"]
    yaml = ctl(daemon, "pods", "-o", "yaml").stdout
    assert yaml.startswith("items:\n  - ") and f'id: "{pod.id}"\n' in yaml
    assert ctl(daemon, "ps", "-q").stdout == f"{container_id}\n"


def test_inspect_verbs_print_json_never_a_repr(daemon, pod) -> None:
    container_id = pod.run(["sleep", "600"])
    assert json.loads(ctl(daemon, "inspectp", pod.id).stdout)["info"]["netns_path"]
    assert json.loads(ctl(daemon, "inspect", container_id).stdout)["info"]["pid"] > 0


def test_errors_under_json_are_json(daemon) -> None:
    done = ctl(daemon, "inspectp", "--json", "nosuchpod", check=False)
    assert done.returncode == 1
    error = json.loads(done.stderr)["error"]
    assert error["code"] == "NOT_FOUND" and "nosuchpod" in error["message"]
    done = subprocess.run([*PODSHIMCTL, "--runtime-root", "/nonexistent", "--json", "pods"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and json.loads(done.stderr)["error"]["message"].startswith("podshimd is not running")


def test_an_unknown_config_field_is_refused_naming_it_and_the_field_it_resembles(daemon, tmp_path) -> None:
    path = tmp_path / "pod.json"
    config = pod_config()
    config["hostnam"] = "typo"
    config["metadata"]["namespaec"] = "x"
    path.write_text(json.dumps(config))
    done = ctl(daemon, "runp", str(path), check=False)
    assert (done.returncode, done.stderr) == (1, (
        f"podshimctl: pod config {path} is not a CRI PodSandboxConfig: 'metadata.namespaec' (did you mean "
        "'namespace'?), 'hostnam' (did you mean 'hostname'?) are not among its fields\n"))
    assert ctl(daemon, "pods", "-q").stdout == ""


def test_create_with_its_files_swapped_says_the_first_looks_like_a_pod_config(daemon, pod, tmp_path) -> None:
    pod_path, container_path = tmp_path / "pod.json", tmp_path / "c.json"
    pod_path.write_text(json.dumps(pod_config()))
    container_path.write_text(json.dumps({**container_config(["true"]), "image": {"image": daemon.image}}))
    done = ctl(daemon, "create", pod.id, str(pod_path), str(container_path), check=False)
    assert done.returncode == 1
    assert done.stderr.startswith(f"podshimctl: {pod_path} looks like a pod config (")
    assert "(the files are swapped?): podshimctl create POD_ID CONTAINER_CONFIG.json POD_CONFIG.json" in done.stderr
