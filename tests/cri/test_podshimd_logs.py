"""podshimd's log as an operator reads it: INFO is the lifecycle of pods and containers with their ids
and the pod's name and namespace as fields; the rest is DEBUG; a plain pod cycle logs no WARNING or
ERROR; a whole daemon's INFO, from its start to its stop, has nothing that reads like an error. SIGHUP
applies the config's log level without a restart."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import anyio
import pytest

from client.cri.logcontext import IdsFilter

from support.critools import REPO, cni_config, running_podshimd
from support.netrelay import loopback_relay
from support.podtools import container_config, node_container, pod_config, pod_service


async def test_a_pod_cycle_logs_its_lifecycle_at_info_and_nothing_that_reads_like_an_error(roots, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.handler.addFilter(IdsFilter())
    config = pod_config()
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(config)
        container_id = await pods.create_container(pod_id, node_container(["sh", "-c", "exit 3"]))
        await pods.start_container(container_id)
        deadline = time.monotonic() + 30
        while (await pods.container_status(container_id))["state"] != "CONTAINER_EXITED":
            assert time.monotonic() < deadline
            await anyio.sleep(0.1)
        await pods.stop_pod_sandbox(pod_id)
        await pods.remove_pod_sandbox(pod_id)
    info = [r for r in caplog.records if r.levelno == logging.INFO and r.name == "client.cri.pod"]
    said = [r.getMessage().split(" (")[0] for r in info]
    assert said == ["pod sandbox ready", f"container {node_container(['true'])['metadata']['name']} created",
                    "container started", "container exited with status 3", "pod sandbox stopped",
                    "pod sandbox removed"], said
    for record in info:
        assert record.pod_id == pod_id
        assert (record.pod_namespace, record.pod_name) == (config["metadata"]["namespace"], config["metadata"]["name"])
    assert [r.container_id for r in info[1:4]] == [container_id] * 3
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    quiet = [r for r in caplog.records if "bundle(s) from" in r.getMessage() or "event stream ended" in r.getMessage()]
    assert quiet and all(r.levelno == logging.DEBUG for r in quiet)


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="podshimd-")
    yield path
    shutil.rmtree(path)


def logged(daemon, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while text not in daemon.log():
        assert time.monotonic() < deadline, f"podshimd did not log {text!r}:\n{daemon.log()}"
        time.sleep(0.1)
    return daemon.log()


def test_sighup_applies_the_configs_log_level_and_names_what_needs_a_restart(directory) -> None:
    with running_podshimd(directory, config='log_level = "info"\n') as daemon:
        with open(daemon.config_path, "w") as f:
            f.write('log_level = "debug"\n')
        os.kill(daemon.process.pid, signal.SIGHUP)
        logged(daemon, "log level is now debug (was info)")
        with open(daemon.config_path, "w") as f:
            f.write('log_level = "warning"\nimage_pull_timeout = 5.0\n')
        os.kill(daemon.process.pid, signal.SIGHUP)
        logged(daemon, "SIGHUP applies the log level only: restart podshimd to apply image_pull_timeout")
        logged(daemon, "log level is now warning (was debug)")
        with open(daemon.config_path, "w") as f:
            f.write('log_level = "loud"\n')
        os.kill(daemon.process.pid, signal.SIGHUP)
        logged(daemon, "SIGHUP: the log level stays warning: ")
        assert daemon.process.poll() is None  # served on throughout


#: Words of a line that reads like an error, which a daemon's INFO of a plain day never holds.
ALARMING = re.compile(r"(?i)\b(cannot|could not|error|fail\w*|refused|no such|closed|ended|lost|traceback)\b")


def test_a_fresh_daemons_whole_info_log_of_a_pod_cycle_reads_as_lifecycle_only(directory, outer_netns, test_images) -> None:
    # The whole daemon as an operator starts it on a node with a CNI config: its first pod starts
    # the shim template, a pull, a container's life, the pod's end, the daemon's stop.
    cni_config(directory, portmap=False)
    port = int(test_images.busybox.ref.split("/", 1)[0].rpartition(":")[2])
    with loopback_relay(outer_netns, port), \
            running_podshimd(directory, netns=outer_netns, image=test_images.busybox) as daemon:
        pod_path, container_path = os.path.join(directory, "pod.json"), os.path.join(directory, "container.json")
        with open(pod_path, "w") as f:
            json.dump(pod_config(), f)
        with open(container_path, "w") as f:
            json.dump({**container_config(["true"]), "image": {"image": daemon.image}}, f)

        def ctl(*argv: str) -> str:
            done = subprocess.run([sys.executable, "-m", "client.cli", "--runtime-root", daemon.runtime_root, *argv],
                                  cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()
        pod_id = ctl("runp", pod_path)
        container_id = ctl("create", pod_id, container_path, pod_path)
        ctl("start", container_id)
        deadline = time.monotonic() + 30
        while json.loads(ctl("inspect", container_id))["state"] != "CONTAINER_EXITED":
            assert time.monotonic() < deadline, "the container did not exit"
            time.sleep(0.1)
        ctl("stopp", pod_id)
        ctl("rmp", pod_id)
    lines = daemon.log().splitlines()
    assert lines and all(" INFO " in line for line in lines), "\n".join(lines)
    assert [line for line in lines if ALARMING.search(line)] == []
    assert "started the shim template" in daemon.log() and lines[-1].endswith(": stopped")
