"""containerd's CRI running pods through podshim's proxy-plugin route: the real containerd
(.ci/pins.toml's) with ``[proxy_plugins.podshim-proxy] type = "sandbox"`` and a runtime handler
with ``sandboxer = "podshim-proxy"``, served by podshim-sandboxer (shim.containerd.proxy), driven
by the real crictl. No shim command runs per pod: the sandboxer forks each pod's shim and
containerd sends the containers' Task v3 calls to that shim. Nothing is left once a pod is
removed, and pods live on across a restart of containerd and of the sandboxer.
"""

from __future__ import annotations

import json
import os
import signal
import time

from support.ctrdtools import PROXY_HANDLER, pod_config
from support.shimtools import ProcessRef


def _record(sandboxer, pod_id):
    with open(os.path.join(sandboxer.state_root, "k8s.io", pod_id, "state.json")) as f:
        return json.load(f)


def _run_container(containerd, crictl, directory, pod_id, pod_json, image, name="c1"):
    container_json = os.path.join(directory, f"{name}.json")
    with open(container_json, "w") as f:
        json.dump({"metadata": {"name": name}, "image": {"image": image}, "log_path": f"{name}.log",
                   "command": ["sh", "-c", f"echo hello from {name}; exec sleep 1000"]}, f)
    created = containerd.crictl(crictl, "create", pod_id, container_json, pod_json)
    assert created.returncode == 0, f"{created.stderr}\n{containerd.log()[-6000:]}"
    cid = created.stdout.strip()
    started = containerd.crictl(crictl, "start", cid)
    assert started.returncode == 0, f"{started.stderr}\n{containerd.log()[-6000:]}"
    return cid


def _remove_pod(containerd, sandboxer, crictl, pod_id):
    stopped = containerd.crictl(crictl, "stopp", pod_id)
    assert stopped.returncode == 0, f"{stopped.stderr}\n{containerd.log()[-6000:]}\n{sandboxer.log()[-4000:]}"
    removed = containerd.crictl(crictl, "rmp", pod_id)
    assert removed.returncode == 0, f"{removed.stderr}\n{containerd.log()[-6000:]}\n{sandboxer.log()[-4000:]}"


def _assert_nothing_left(containerd, sandboxer, crictl):
    assert containerd.crictl(crictl, "pods", "-q").stdout.strip() == ""
    assert sandboxer.bundles() == []
    assert containerd.sandbox_bundles() == []  # the shim sandboxer made none: no `start` ran
    assert containerd.task_bundles() == []
    assert containerd.netns_files() == []
    assert containerd.shim_sockets() == []
    assert sandboxer.shims() == []


def test_a_pod_and_its_container_run_through_the_proxy_route_and_leave_nothing(containerd, sandboxer, crictl,
                                                                                 directory, test_images) -> None:
    image = test_images.busybox.ref
    assert containerd.crictl(crictl, "pull", image, timeout=120).returncode == 0
    pod_json = pod_config(directory, "app")
    ran = containerd.crictl(crictl, "runp", "--runtime", PROXY_HANDLER, pod_json)
    assert ran.returncode == 0, f"{ran.stderr}\n{containerd.log()[-6000:]}\n{sandboxer.log()[-4000:]}"
    pod_id = ran.stdout.strip()
    status = json.loads(containerd.crictl(crictl, "inspectp", pod_id).stdout)
    assert status["status"]["state"] == "SANDBOX_READY"
    assert sandboxer.bundles() == [pod_id]
    assert containerd.sandbox_bundles() == []
    record = _record(sandboxer, pod_id)
    assert (record["sandbox_id"], record["state"]) == (pod_id, "running")
    assert sandboxer.shims() == [record["shim_pid"]], _ps(sandboxer.shims())
    pause = ProcessRef(record["pause"]["pid"])
    # the pause is in the network namespace containerd's CRI made
    assert os.stat(f"/proc/{pause.pid}/ns/net").st_ino == os.stat(record["netns_path"]).st_ino

    cid = _run_container(containerd, crictl, directory, pod_id, pod_json, image)
    task = json.loads(containerd.crictl(crictl, "inspect", cid).stdout)
    assert task["status"]["state"] == "CONTAINER_RUNNING"
    container_pid = task["info"]["pid"]
    for ns in ("net", "ipc", "uts"):  # the container joined the pod's namespaces, kernel-side
        assert os.stat(f"/proc/{container_pid}/ns/{ns}").st_ino == os.stat(f"/proc/{pause.pid}/ns/{ns}").st_ino
    # the container's task runs under the pod's shim: containerd dialled the shim's socket
    assert _parent(container_pid) in (record["shim_pid"], *_children(record["shim_pid"]))
    executed = containerd.crictl(crictl, "exec", "-s", cid, "sh", "-c", "echo out; hostname")
    assert executed.returncode == 0, f"{executed.stderr}\n{containerd.log()[-6000:]}"
    assert executed.stdout.split() == ["out", "app"]
    logs = containerd.crictl(crictl, "logs", cid)
    assert (logs.returncode, logs.stdout) == (0, "hello from c1\n"), logs.stderr
    assert containerd.crictl(crictl, "stop", "-t", "0", cid).returncode == 0
    assert containerd.crictl(crictl, "rm", cid).returncode == 0

    _remove_pod(containerd, sandboxer, crictl, pod_id)
    assert pause.has_exited()
    pause.close()
    _assert_nothing_left(containerd, sandboxer, crictl)



def _pod_with_container(containerd, sandboxer, crictl, directory, image, name):
    assert containerd.crictl(crictl, "pull", image, timeout=120).returncode == 0
    pod_json = pod_config(directory, name)
    ran = containerd.crictl(crictl, "runp", "--runtime", PROXY_HANDLER, pod_json)
    assert ran.returncode == 0, f"{ran.stderr}\n{containerd.log()[-6000:]}\n{sandboxer.log()[-4000:]}"
    pod_id = ran.stdout.strip()
    return pod_id, _run_container(containerd, crictl, directory, pod_id, pod_json, image)


def _pod_state(containerd, crictl, pod_id):
    inspected = containerd.crictl(crictl, "inspectp", pod_id)
    assert inspected.returncode == 0, inspected.stderr
    return json.loads(inspected.stdout)["status"]["state"]


def _container_state(containerd, crictl, cid):
    return json.loads(containerd.crictl(crictl, "inspect", cid).stdout)["status"]["state"]


def _assert_alive(containerd, crictl, pod_id, cid):
    assert _pod_state(containerd, crictl, pod_id) == "SANDBOX_READY"
    assert _container_state(containerd, crictl, cid) == "CONTAINER_RUNNING"
    executed = containerd.crictl(crictl, "exec", "-s", cid, "echo", "still here")
    assert (executed.returncode, executed.stdout.strip()) == (0, "still here"), executed.stderr


def test_a_pod_lives_on_across_a_restart_of_containerd(containerd, sandboxer, crictl, directory, test_images) -> None:
    pod_id, cid = _pod_with_container(containerd, sandboxer, crictl, directory, test_images.busybox.ref, "ctrd")
    shim_pid = _record(sandboxer, pod_id)["shim_pid"]
    containerd.kill_and_restart()
    containerd.wait_cri(crictl)
    # containerd asked the sandboxer for the pod's Status and Wait, and reconnected to the shim's tasks
    _assert_alive(containerd, crictl, pod_id, cid)
    assert sandboxer.shims() == [shim_pid]
    _remove_pod(containerd, sandboxer, crictl, pod_id)
    _assert_nothing_left(containerd, sandboxer, crictl)


def test_a_pod_lives_on_across_a_kill_of_the_sandboxer_and_stops_through_the_new_one(containerd, sandboxer, crictl,
                                                                                      directory, test_images) -> None:
    pod_id, cid = _pod_with_container(containerd, sandboxer, crictl, directory, test_images.busybox.ref, "sbx")
    shim_pid = _record(sandboxer, pod_id)["shim_pid"]
    sandboxer.kill_and_restart()
    # containerd's gRPC connection to the proxy plugin reconnects after its backoff (grpc-go's: 1 s,
    # then 1.6 times more each time); until then its calls fail with UNAVAILABLE
    deadline = time.monotonic() + 30
    while containerd.crictl(crictl, "inspectp", pod_id).returncode != 0:
        assert time.monotonic() < deadline, f"{containerd.log()[-4000:]}\n{sandboxer.log()[-4000:]}"
        time.sleep(0.2)
    # the new sandboxer answers for the pod from its bundle and its shim's socket
    _assert_alive(containerd, crictl, pod_id, cid)
    assert sandboxer.shims() == [shim_pid]
    # containerd's Wait, broken by the kill, was retried on the new sandboxer: the stop reaches the cache
    _remove_pod(containerd, sandboxer, crictl, pod_id)
    _assert_nothing_left(containerd, sandboxer, crictl)


def test_a_killed_shim_ends_its_pod_and_its_removal_leaves_nothing(containerd, sandboxer, crictl, directory,
                                                                     test_images) -> None:
    pod_id, cid = _pod_with_container(containerd, sandboxer, crictl, directory, test_images.busybox.ref, "dead")
    record = _record(sandboxer, pod_id)
    pause = ProcessRef(record["pause"]["pid"])
    os.kill(record["shim_pid"], signal.SIGKILL)
    # the sandboxer's Wait on the shim broke and the shim does not accept: the pod ended (what delete
    # does: the pause killed), and containerd's CRI sees it NOTREADY
    deadline = time.monotonic() + 30
    while _pod_state(containerd, crictl, pod_id) != "SANDBOX_NOTREADY":
        assert time.monotonic() < deadline, f"{containerd.log()[-4000:]}\n{sandboxer.log()[-4000:]}"
        time.sleep(0.2)
    assert pause.has_exited()
    pause.close()
    stopped = containerd.crictl(crictl, "stopp", pod_id)
    assert stopped.returncode == 0, f"{stopped.stderr}\n{containerd.log()[-6000:]}\n{sandboxer.log()[-4000:]}"
    # containerd's CRI learns of the container's exit when its Task Wait on the dead shim fails; handling
    # that exit can fail once and is retried by its event backoff (1 s, doubling), and until then
    # RemovePodSandbox says the container still runs (containerd's, as on the shim route)
    deadline = time.monotonic() + 30
    while (removed := containerd.crictl(crictl, "rmp", pod_id)).returncode != 0:
        assert "container is still running" in removed.stderr, removed.stderr
        assert time.monotonic() < deadline, f"{removed.stderr}\n{containerd.log()[-6000:]}"
        time.sleep(0.5)
    _assert_nothing_left(containerd, sandboxer, crictl)

def _parent(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("PPid:")[1].split()[0])


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _ps(pids):
    out = []
    for pid in pids:
        try:
            ppid = _parent(pid)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f"{pid} (parent {ppid}): {f.read().replace(bytes(1), b' ')[:200]!r}")
        except OSError:
            out.append(f"{pid}: gone")
    return "\n".join(out)


def test_without_a_template_the_sandboxer_starts_each_shim_with_podshim_start(containerd, crictl, directory) -> None:
    from support.ctrdtools import running_sandboxer

    with running_sandboxer(containerd, use_template=False) as sandboxer:
        ran = containerd.crictl(crictl, "runp", "--runtime", PROXY_HANDLER, pod_config(directory, "plain"))
        assert ran.returncode == 0, f"{ran.stderr}\n{containerd.log()[-6000:]}\n{sandboxer.log()[-4000:]}"
        pod_id = ran.stdout.strip()
        assert _pod_state(containerd, crictl, pod_id) == "SANDBOX_READY"
        assert not os.path.exists(os.path.join(containerd.runtime_root, "template.sock"))
        assert sandboxer.shims() == [_record(sandboxer, pod_id)["shim_pid"]]
        _remove_pod(containerd, sandboxer, crictl, pod_id)
        _assert_nothing_left(containerd, sandboxer, crictl)
