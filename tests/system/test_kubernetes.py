"""Kubernetes on podshimd, with the real kubectl against one harness cluster (bench/cluster.py)
of two podshimd nodes for the whole module, its tests in the file's order.

What a user does with a cluster: a Deployment over both nodes (scaled to zero and back, rolled to
a new image), pod to pod across nodes, a Service through kube-proxy; logs (-f, --previous), exec
-it on a terminal, attach, port-forward, cp; restart policies, liveness probes (exec, HTTP, TCP),
readiness gating a Service's endpoints, init containers, a Job, a CronJob's pod; ConfigMap,
Secret, emptyDir and downward-API volumes; requests and limits as the node's cgroup values,
OOMKilled, the grace period of a deletion; image pull policies, ImagePullBackOff, a private
registry with an imagePullSecret.

Then faults: podshimd killed with SIGKILL (the pods keep running, kubelet reconverges with the
restarted podshimd, no container is made twice); a node's kubelet stopped (the node goes NotReady
and its Deployment's pods are made again on the other node; the kubelet back, the old pods go); a
node rebooted (every process of it killed, its mounts and /run gone, podshimd and kubelet started
again: its pods come back). Last, kubelet's garbage collection of dead containers, deleted pods'
sandboxes and unused images in podshimd.

The kubelets restart a crashed container after at most 2 s (crashLoopBackOff) and remove an image
unused for 60 s at their image GC, which runs every 5 minutes from their start (kubelet's fixed
period): the module lasts that long at least. Slow: about 6 minutes on a warm tools cache.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench import cluster as harness

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support import kubetools as kt  # noqa: E402  (once bench/ or tests/ is on the path)
from support.registry import AUTH, registry_config, write_htpasswd  # noqa: E402  (once bench/ or tests/ is on the path)
from support.ttytools import OnTerminal  # noqa: E402  (once bench/ or tests/ is on the path)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

BUSYBOX = harness.BUSYBOX
#: busybox again, with a label of its own: another image (the rolling update's target).
BUSYBOX_2 = f"{harness.REGISTRY}/podshim/busybox:2.0"
#: Another busybox, run once and then unused: what the kubelet's image GC removes.
GC_IMAGE = f"{harness.REGISTRY}/podshim/gc:1.0"
PRIVATE_IMAGE = f"{harness.PRIVATE_REGISTRY}/podshim/private:1.0"
KUBELET = {
    "crashLoopBackOff": {"maxContainerRestartPeriod": "2s"},
    "imageMinimumGCAge": "30s", "imageMaximumGCAge": "60s",
}
#: kubelet's image GC period (ImageGCPeriod, fixed): its first run that may remove an image.
IMAGE_GC_PERIOD = 300.0

CRONJOB = """
apiVersion: batch/v1
kind: CronJob
metadata: {name: every-minute}
spec:
  schedule: "* * * * *"
  successfulJobsHistoryLimit: 3
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
          - {name: tick, image: IMAGE, command: ["sh", "-c", "echo cron ran"]}
"""

ONCE = """
apiVersion: v1
kind: Pod
metadata: {name: gc-image}
spec:
  restartPolicy: Never
  nodeName: node1
  containers:
  - {name: once, image: IMAGE, command: ["true"]}
"""

TOOLS = """
apiVersion: v1
kind: Pod
metadata: {name: tools}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: sh, image: IMAGE, command: ["sleep", "3600"]}
"""


@pytest.fixture(scope="module")
def c() -> Iterator[harness.Cluster]:
    from support.imagebuild import ImageConfig

    with harness.cluster(nodes=2, name=f"w{os.getpid()}", kubelet=KUBELET) as made:

        made.push_busybox(BUSYBOX_2, ImageConfig(cmd=("sh",), labels=(("version", "2"),)))
        made.push_busybox(GC_IMAGE, ImageConfig(cmd=("sh",), labels=(("for", "gc"),)))
        private = made.state.file("private-registry")
        os.makedirs(private)
        config = os.path.join(private, "config.yml")
        with open(config, "w") as f:
            f.write(registry_config(private, harness.PRIVATE_REGISTRY,
                                    write_htpasswd(os.path.join(private, "htpasswd"), AUTH)))
        made.serve("private-registry", config)
        made.push_busybox(PRIVATE_IMAGE, creds=f"{AUTH[0]}:{AUTH[1]}")
        # What needs time to pass starts now: the CronJob's next minute, the image GC's 5 minutes.
        made.state.data["started"] = time.monotonic()
        kt.apply(made, CRONJOB, IMAGE=BUSYBOX)
        kt.apply(made, ONCE, IMAGE=GC_IMAGE)
        kt.apply(made, TOOLS, IMAGE=BUSYBOX)
        # The image GC test's image, run once and unused from here on (more than a minute before
        # the first image GC that may remove it).
        once = kt.wait_pod(made, "gc-image", "Succeeded", lambda p: p["status"].get("phase") == "Succeeded")
        made.state.data["gc_image"] = kt.container(once, "once")["image"]
        made.state.data["gc_image_id"] = next(i["id"] for i in kt.crictl(made, 1, "images")["images"]
                                              if GC_IMAGE in i["repoTags"])
        made.kubectl("delete", "pod", "gc-image")
        yield made


def tools(c: harness.Cluster) -> str:
    kt.wait_pod(c, "tools", "running", kt.running)
    return "tools"


# -- nodes, a Deployment, the network ----------------------------------------------------------------

def test_nodes_are_ready_and_show_podshims_runtime(c) -> None:
    wide = c.kubectl("get", "nodes", "-o", "wide").stdout
    lines = wide.splitlines()[1:]
    assert [line.split()[:2] for line in lines] == [["node1", "Ready"], ["node2", "Ready"]], wide
    assert all("podshim://" in line for line in lines), wide


def test_a_deployment_spreads_over_both_nodes_and_pods_and_a_service_answer_across_them(c) -> None:
    line = harness.smoke(c, 2)
    assert line.startswith("smoke: 6 pods on 2 nodes"), line


def smoke_pods(c: harness.Cluster) -> list[dict[str, Any]]:
    return [p for p in kt.get(c, "pods", "-l", "app=smoke")["items"] if not p["metadata"].get("deletionTimestamp")]


def test_the_deployment_scales_to_zero_and_back(c) -> None:
    uids = {p["metadata"]["uid"]: kt.node_number(c, p["spec"]["nodeName"]) for p in smoke_pods(c)}
    c.kubectl("scale", "deployment/smoke", "--replicas=0")
    kt.wait_until("no pod of the Deployment left", lambda: kt.get(c, "pods", "-l", "app=smoke")["items"],
                  lambda items: not items)
    for uid, number in uids.items():
        assert not [x for x in kt.node_containers(c, number, uid) if x["state"] == "CONTAINER_RUNNING"]
    c.kubectl("scale", "deployment/smoke", "--replicas=6")
    c.kubectl("rollout", "status", "deployment/smoke", "--timeout=180s", timeout=200)
    pods = smoke_pods(c)
    assert len(pods) == 6 and all(kt.ready(p) for p in pods)
    assert len({p["spec"]["nodeName"] for p in pods}) == 2


def test_a_rolling_update_moves_every_pod_to_the_new_image(c) -> None:
    before = {p["metadata"]["name"] for p in smoke_pods(c)}
    c.kubectl("set", "image", "deployment/smoke", f"web={BUSYBOX_2}")
    c.kubectl("rollout", "status", "deployment/smoke", "--timeout=180s", timeout=200)
    pods = kt.wait_until("the old pods gone", lambda: smoke_pods(c), lambda ps: len(ps) == 6)
    assert not before & {p["metadata"]["name"] for p in pods}
    assert {kt.container(p, "web")["image"] for p in pods} == {BUSYBOX_2}
    deployment = kt.get(c, "deployment", "smoke")
    assert deployment["status"]["updatedReplicas"] == deployment["status"]["availableReplicas"] == 6


# -- logs, exec, attach, port-forward, cp ------------------------------------------------------------

LOGGER = """
apiVersion: v1
kind: Pod
metadata: {name: logger}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{name: state, emptyDir: {}}]
  containers:
  - name: log
    image: IMAGE
    volumeMounts: [{name: state, mountPath: /state}]
    command: ["sh", "-c", "n=$(( $(cat /state/n 2>/dev/null || echo 0) + 1 )); echo $n > /state/n; echo attempt $n;
              [ $n = 1 ] && exit 1; i=0; while true; do i=$((i+1)); echo tick $i; sleep 1; done"]
"""


def test_logs_follow_and_show_the_previous_container(c) -> None:
    kt.apply(c, LOGGER, IMAGE=BUSYBOX)
    kt.wait_pod(c, "logger", "restarted once and running",
                lambda p: kt.container(p, "log").get("restartCount") == 1 and kt.running(p))
    assert c.kubectl("logs", "logger", "--previous").stdout.strip() == "attempt 1"
    assert c.kubectl("logs", "logger").stdout.startswith("attempt 2\ntick 1\n")
    follow = kt.Kubectl(c, "logs", "-f", "logger")
    try:
        first = int(follow.read_until("tick").split()[1])
        assert int(follow.read_until(f"tick {first + 2}").split()[1]) == first + 2  # new lines as they come
    finally:
        follow.stop()


def test_exec_it_runs_a_shell_on_a_terminal_of_the_callers_size(c) -> None:
    terminal = OnTerminal(c.kubectl_argv("exec", "-it", tools(c), "--", "sh"), rows=24, cols=80)
    try:
        terminal.type(b"tty; stty size; echo $((6 * 7))\n")
        assert terminal.read_until(rb"/dev/pts/\d+")
        assert terminal.read_until(rb"24 80")
        assert terminal.read_until(rb"\n42")
        terminal.resize(30, 100)
        terminal.type(b"stty size\n")
        assert terminal.read_until(rb"30 100")
        terminal.type(b"exit 3\n")
        assert terminal.wait() == 3
    finally:
        terminal.close()


ECHO = """
apiVersion: v1
kind: Pod
metadata: {name: echo}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: echo, image: IMAGE, stdin: true, command: ["sh", "-c", "while read line; do echo got $line; done"]}
"""


def test_attach_reaches_the_containers_stdin_and_stdout(c) -> None:
    kt.apply(c, ECHO, IMAGE=BUSYBOX)
    kt.wait_pod(c, "echo", "running", kt.running)
    attach = kt.Kubectl(c, "attach", "-i", "echo", stdin=True)
    try:
        # kubectl says nothing when attached: say something until the answer comes.
        deadline = time.monotonic() + 30
        while True:
            attach.write("hello\n")
            try:
                attach.read_until("got hello", timeout=2)
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
        attach.write("second line\n")
        attach.read_until("got second line")
    finally:
        attach.stop()
    assert "got second line" in c.kubectl("logs", "echo").stdout


def test_port_forward_reaches_a_pods_port(c) -> None:
    pod = smoke_pods(c)[0]["metadata"]["name"]
    forward = kt.Kubectl(c, "port-forward", f"pod/{pod}", ":8080")
    try:
        port = int(forward.read_until("Forwarding from 127.0.0.1:").split("127.0.0.1:")[1].split()[0])
        got = subprocess.run(["nsenter", f"--net=/proc/{c.state.data['outer']}/ns/net", "curl", "-sf",
                              f"http://127.0.0.1:{port}/"], capture_output=True, text=True, timeout=30)
        assert got.returncode == 0 and got.stdout.strip() == pod, got
    finally:
        forward.stop()


def test_cp_copies_into_and_out_of_a_container(c, tmp_path) -> None:
    pod = tools(c)
    source = tmp_path / "in.txt"
    source.write_text("from the test\n")
    c.kubectl("cp", str(source), f"{pod}:/tmp/in.txt")
    assert c.kubectl("exec", pod, "--", "cat", "/tmp/in.txt").stdout == "from the test\n"
    c.kubectl("cp", f"{pod}:/etc/passwd", str(tmp_path / "passwd"))
    assert (tmp_path / "passwd").read_text() == c.kubectl("exec", pod, "--", "cat", "/etc/passwd").stdout


# -- restarts, probes, init containers, Jobs ---------------------------------------------------------

def test_restart_policies_decide_which_exits_restart(c) -> None:
    kt.apply(c, kt.RESTART_POLICIES, IMAGE=BUSYBOX)
    failed = kt.wait_pod(c, "never-fails", "Failed", lambda p: p["status"].get("phase") == "Failed")
    state = kt.container(failed, "c")
    assert state["restartCount"] == 0 and state["state"]["terminated"]["exitCode"] == 3
    done = kt.wait_pod(c, "onfailure-once", "Succeeded", lambda p: p["status"].get("phase") == "Succeeded")
    assert kt.container(done, "c")["restartCount"] == 1
    kt.wait_pod(c, "always-exits-0", "restarted after exiting 0",
                lambda p: kt.container(p, "c").get("restartCount", 0) >= 2)
    c.kubectl("delete", "pod", "never-fails", "onfailure-once", "always-exits-0", "--wait=false")


LIVENESS = """
apiVersion: v1
kind: Pod
metadata: {name: liveness}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: exec
    image: IMAGE
    command: ["sh", "-c", "touch /tmp/ok; sleep 4; rm /tmp/ok; sleep 3600"]
    livenessProbe: {exec: {command: ["cat", "/tmp/ok"]}, periodSeconds: 1, failureThreshold: 2}
  - name: http
    image: IMAGE
    command: ["sh", "-c", "mkdir /www; echo ok > /www/ok; httpd -p 8081 -h /www; sleep 4; rm /www/ok; sleep 3600"]
    livenessProbe: {httpGet: {path: /ok, port: 8081}, periodSeconds: 1, failureThreshold: 2}
  - name: tcp
    image: IMAGE
    command: ["sh", "-c", "httpd -f -p 8082 -h / & sleep 4; kill $!; sleep 3600"]
    livenessProbe: {tcpSocket: {port: 8082}, periodSeconds: 1, failureThreshold: 2}
"""


def test_liveness_probes_of_each_kind_restart_their_container(c) -> None:
    kt.apply(c, LIVENESS, IMAGE=BUSYBOX)
    kt.wait_pod(c, "liveness", "had each container restarted by its probe",
                lambda p: all(kt.container(p, n).get("restartCount", 0) >= 1 for n in ("exec", "http", "tcp")))
    messages = kt.wait_events(c, "liveness", "saying each probe's restart", lambda ms: all(
        any(f"Container {name} failed liveness probe, will be restarted" in m for m in ms)
        for name in ("exec", "http", "tcp")))
    assert any(m.startswith("Liveness probe failed") for m in messages), messages
    c.kubectl("delete", "pod", "liveness", "--wait=false")


GATE = """
apiVersion: v1
kind: Pod
metadata: {name: gate, labels: {app: gate}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: IMAGE
    command: ["sh", "-c", "mkdir /www; echo gate > /www/index.html; exec httpd -f -p 8080 -h /www"]
    readinessProbe: {exec: {command: ["cat", "/tmp/ready"]}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: gate}
spec:
  selector: {app: gate}
  ports: [{port: 80, targetPort: 8080}]
"""


def endpoints(c: harness.Cluster, service: str) -> list[tuple[str, bool]]:
    """The addresses of a Service's EndpointSlices and whether each is ready."""
    slices = kt.get(c, "endpointslices", "-l", f"kubernetes.io/service-name={service}")["items"]
    return [(address, bool(e["conditions"].get("ready"))) for s in slices for e in s.get("endpoints") or []
            for address in e["addresses"]]


def test_readiness_gates_the_services_endpoints(c) -> None:
    kt.apply(c, GATE, IMAGE=BUSYBOX)
    p = kt.wait_pod(c, "gate", "running", kt.running)
    ip = p["status"]["podIP"]
    assert kt.wait_until("the endpoint listed, not ready", lambda: endpoints(c, "gate"), bool) == [(ip, False)]
    assert not kt.ready(kt.pod(c, "gate"))
    c.kubectl("exec", "gate", "--", "touch", "/tmp/ready")
    kt.wait_until("the endpoint ready", lambda: endpoints(c, "gate"), lambda e: e == [(ip, True)])
    service_ip = kt.get(c, "service", "gate")["spec"]["clusterIP"]
    assert harness.http_get(c, tools(c), service_ip, 80) == "gate"
    c.kubectl("exec", "gate", "--", "rm", "/tmp/ready")
    kt.wait_until("the endpoint not ready again", lambda: endpoints(c, "gate"), lambda e: e == [(ip, False)])


INIT = """
apiVersion: v1
kind: Pod
metadata: {name: init}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{name: work, emptyDir: {}}]
  initContainers:
  - {name: first, image: IMAGE, command: ["sh", "-c", "echo first >> /work/order"],
     volumeMounts: [{name: work, mountPath: /work}]}
  - {name: second, image: IMAGE, command: ["sh", "-c", "echo second >> /work/order"],
     volumeMounts: [{name: work, mountPath: /work}]}
  containers:
  - {name: app, image: IMAGE, command: ["sh", "-c", "echo app >> /work/order; cat /work/order; sleep 3600"],
     volumeMounts: [{name: work, mountPath: /work}]}
"""


def test_init_containers_run_in_order_to_completion_before_the_app(c) -> None:
    kt.apply(c, INIT, IMAGE=BUSYBOX)
    p = kt.wait_pod(c, "init", "running", kt.running)
    for name in ("first", "second"):
        terminated = kt.container(p, name, init=True)["state"]["terminated"]
        assert (terminated["reason"], terminated["exitCode"]) == ("Completed", 0)
    assert kt.wait_until("the app's log", lambda: c.kubectl("logs", "init", "-c", "app").stdout,
                         lambda log: "app" in log) == "first\nsecond\napp\n"
    c.kubectl("delete", "pod", "init", "--wait=false")


JOB = """
apiVersion: batch/v1
kind: Job
metadata: {name: count}
spec:
  completions: 3
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: IMAGE, command: ["sh", "-c", "echo done by $(hostname)"]}]
"""


def test_a_job_runs_to_completion(c) -> None:
    kt.apply(c, JOB, IMAGE=BUSYBOX)
    c.kubectl("wait", "--for=condition=complete", "job/count", "--timeout=120s", timeout=130)
    pods = kt.get(c, "pods", "-l", "job-name=count")["items"]
    assert len(pods) == 3 and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    for p in pods:
        name = p["metadata"]["name"]
        assert c.kubectl("logs", name).stdout == f"done by {name}\n"


def test_a_cronjobs_pod_runs_to_completion(c) -> None:
    def succeeded() -> list[dict[str, Any]]:
        jobs = kt.get(c, "jobs")["items"]
        return [j for j in jobs if j["metadata"].get("ownerReferences", [{}])[0].get("name") == "every-minute"
                and j["status"].get("succeeded")]

    # The CronJob was made with the cluster: its first minute has begun.
    job = kt.wait_until("a Job of the CronJob succeeded", succeeded, timeout=150, interval=2)[0]
    pods = kt.get(c, "pods", "-l", f"job-name={job['metadata']['name']}")["items"]
    assert pods and c.kubectl("logs", pods[0]["metadata"]["name"]).stdout == "cron ran\n"
    c.kubectl("patch", "cronjob", "every-minute", "-p", '{"spec": {"suspend": true}}')


# -- volumes ---------------------------------------------------------------------------------------

VOLUMES = """
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {greeting: hello from a configmap}
---
apiVersion: v1
kind: Secret
metadata: {name: token}
stringData: {token: s3cret}
---
apiVersion: v1
kind: Pod
metadata: {name: volumes, labels: {tier: test}}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: settings, configMap: {name: settings}}
  - {name: token, secret: {secretName: token, defaultMode: 0400}}
  - {name: scratch, emptyDir: {}}
  - name: about
    downwardAPI:
      items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
      - {path: name, fieldRef: {fieldPath: metadata.name}}
      - {path: mem, resourceFieldRef: {containerName: c, resource: limits.memory, divisor: 1Mi}}
  containers:
  - name: c
    image: IMAGE
    command: ["sleep", "3600"]
    resources: {limits: {memory: 48Mi}}
    volumeMounts:
    - {name: settings, mountPath: /etc/settings}
    - {name: token, mountPath: /etc/token, readOnly: true}
    - {name: scratch, mountPath: /scratch}
    - {name: about, mountPath: /etc/about}
"""


def test_configmap_secret_emptydir_and_downward_api_volumes(c) -> None:
    kt.apply(c, VOLUMES, IMAGE=BUSYBOX)
    kt.wait_pod(c, "volumes", "running", kt.running)

    def sh(command: str) -> str:
        return c.kubectl("exec", "volumes", "--", "sh", "-c", command).stdout

    assert sh("cat /etc/settings/greeting") == "hello from a configmap"
    assert sh("cat /etc/token/token; stat -L -c ' %a' /etc/token/token") == "s3cret 400\n"
    assert sh("echo scratch > /scratch/f && cat /scratch/f; grep ' /scratch ' /proc/mounts | wc -l") == "scratch\n1\n"
    assert sh("cat /etc/about/name; echo; cat /etc/about/labels; echo; cat /etc/about/mem") == \
        'volumes\ntier="test"\n48'
    assert "Read-only file system" in c.kubectl("exec", "volumes", "--", "touch", "/etc/token/x", check=False).stderr
    c.kubectl("delete", "pod", "volumes", "--wait=false")


# -- resources -----------------------------------------------------------------------------------------

LIMITS = """
apiVersion: v1
kind: Pod
metadata: {name: limits}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: IMAGE
    command: ["sleep", "3600"]
    resources:
      requests: {cpu: 100m, memory: 32Mi}
      limits: {cpu: 250m, memory: 64Mi}
"""


def test_requests_and_limits_are_the_containers_cgroup_values_on_its_node(c):
    kt.apply(c, LIMITS, IMAGE=BUSYBOX)
    p = kt.wait_pod(c, "limits", "running", kt.running)
    assert p["status"]["qosClass"] == "Burstable"
    number = kt.node_number(c, p["spec"]["nodeName"])
    # The container's cgroups as it sees them: the node's cgroup namespace is the node's root too.
    paths = dict(line.split(":", 2)[1:] for line in
                 c.kubectl("exec", "limits", "--", "cat", "/proc/self/cgroup").stdout.splitlines())
    assert f"/kubepods/burstable/pod{p['metadata']['uid']}/" in paths.get("memory", paths.get(""))

    def read(controller: str, name: str) -> str:
        return c.in_node(number, ["cat", f"/sys/fs/cgroup/{controller}{paths[controller]}/{name}"]).stdout.strip()

    if "memory" in paths:  # cgroup v1
        assert read("memory", "memory.limit_in_bytes") == str(64 << 20)
        assert read("cpu", "cpu.cfs_quota_us") == "25000" and read("cpu", "cpu.cfs_period_us") == "100000"
        assert read("cpu", "cpu.shares") == "102"
    else:
        paths["unified"] = paths[""]
        assert read("unified", "memory.max") == str(64 << 20)
        assert read("unified", "cpu.max") == "25000 100000"
    c.kubectl("delete", "pod", "limits", "--wait=false")


OOM = """
apiVersion: v1
kind: Pod
metadata: {name: oom}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: IMAGE
    command: ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"]
    resources: {limits: {memory: 16Mi}}
"""


def test_a_container_over_its_memory_limit_is_oom_killed(c) -> None:
    kt.apply(c, OOM, IMAGE=BUSYBOX)
    p = kt.wait_pod(c, "oom", "Failed", lambda p: p["status"].get("phase") == "Failed")
    terminated = kt.container(p, "c")["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)
    assert c.kubectl("get", "pod", "oom").stdout.split("\n")[1].split()[2] == "OOMKilled"


GRACE = """
apiVersion: v1
kind: Pod
metadata: {name: ignores-term}
spec:
  terminationGracePeriodSeconds: 5
  containers: [{name: c, image: IMAGE, command: ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: exits-on-term}
spec:
  terminationGracePeriodSeconds: 60
  containers: [{name: c, image: IMAGE, command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]}]
"""


def test_deletion_waits_the_grace_period_for_a_container_that_ignores_sigterm(c) -> None:
    kt.apply(c, GRACE, IMAGE=BUSYBOX)
    for name in ("ignores-term", "exits-on-term"):
        kt.wait_pod(c, name, "running", kt.running)
    took = kt.delete(c, "pod", "ignores-term")
    assert took >= 5, f"deleted in {took:.1f} s, before its grace period of 5 s"
    took = kt.delete(c, "pod", "exits-on-term")
    assert took < 30, f"a container that exits on SIGTERM took {took:.1f} s of its 60 s"


# -- images ----------------------------------------------------------------------------------------

PULLS = """
apiVersion: v1
kind: Pod
metadata: {name: pull-always}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: BUSYBOX, imagePullPolicy: Always, command: ["sleep", "3600"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: pull-ifnotpresent}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: BUSYBOX, imagePullPolicy: IfNotPresent, command: ["sleep", "3600"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: pull-never}
spec:
  containers: [{name: c, image: NEVER, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: pull-missing}
spec:
  containers: [{name: c, image: MISSING}]
"""


def waiting_reason(p: dict[str, Any]) -> str:
    return kt.container(p, "c").get("state", {}).get("waiting", {}).get("reason", "")


def test_image_pull_policies_and_a_missing_images_backoff(c) -> None:
    kt.wait_pod(c, "tools", "running", kt.running)  # busybox is on a node
    kt.apply(c, PULLS, BUSYBOX=BUSYBOX, NEVER=f"{harness.REGISTRY}/podshim/never-pulled:1.0",
             MISSING=f"{harness.REGISTRY}/podshim/missing:1.0")
    for name in ("pull-always", "pull-ifnotpresent"):
        kt.wait_pod(c, name, "running", kt.running)
    kt.wait_events(c, "pull-always", "saying it pulled",
                   lambda ms: any(m.startswith(f'Successfully pulled image "{BUSYBOX}"') for m in ms))
    kt.wait_events(c, "pull-ifnotpresent", "saying it did not pull",
                   lambda ms: any(f'Container image "{BUSYBOX}" already present on machine' in m for m in ms))
    kt.wait_pod(c, "pull-never", "waiting with ErrImageNeverPull", lambda p: waiting_reason(p) == "ErrImageNeverPull")
    kt.wait_pod(c, "pull-missing", "in ImagePullBackOff", lambda p: waiting_reason(p) == "ImagePullBackOff")
    kt.wait_events(c, "pull-missing", "saying the image is not found", lambda ms: any(
        f"Failed to pull image \"{harness.REGISTRY}/podshim/missing:1.0\"" in m and "not found" in m for m in ms),
        reason="Failed")
    c.kubectl("delete", "pod", "pull-always", "pull-ifnotpresent", "pull-never", "pull-missing", "--wait=false")


PRIVATE = """
apiVersion: v1
kind: Pod
metadata: {name: NAME}
spec:
  terminationGracePeriodSeconds: 1
  SECRETS
  containers: [{name: c, image: IMAGE, command: ["sleep", "3600"]}]
"""


def test_a_private_registrys_image_is_pulled_with_its_image_pull_secret(c) -> None:
    kt.apply(c, PRIVATE, NAME="private-no-secret", SECRETS="", IMAGE=PRIVATE_IMAGE)
    kt.wait_pod(c, "private-no-secret", "refused its image",
                lambda p: waiting_reason(p) in ("ErrImagePull", "ImagePullBackOff"))
    kt.wait_events(c, "private-no-secret", "saying the registry wants credentials", lambda ms: any(
        "code = Unauthenticated" in m and f"{harness.PRIVATE_REGISTRY} wants credentials" in m for m in ms),
        reason="Failed")
    c.kubectl("create", "secret", "docker-registry", "private-registry", f"--docker-server={harness.PRIVATE_REGISTRY}",
              f"--docker-username={AUTH[0]}", f"--docker-password={AUTH[1]}")
    kt.apply(c, PRIVATE, NAME="private", SECRETS="imagePullSecrets: [{name: private-registry}]", IMAGE=PRIVATE_IMAGE)
    p = kt.wait_pod(c, "private", "running", kt.running)
    assert kt.container(p, "c")["image"] == PRIVATE_IMAGE
    c.kubectl("delete", "pod", "private-no-secret", "private", "--wait=false")


# -- faults ------------------------------------------------------------------------------------------

PINNED = """
apiVersion: v1
kind: Pod
metadata: {name: pinned}
spec:
  nodeName: node2
  terminationGracePeriodSeconds: 1
  containers:
  - {name: web, image: IMAGE, command: ["sh", "-c", "mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 8080 -h /www"]}
"""


def node_ready(c: harness.Cluster, name: str) -> bool:
    node = kt.get(c, "node", name)
    return any(x["type"] == "Ready" and x["status"] == "True" for x in node["status"]["conditions"])


def httpd_pids(c: harness.Cluster, number: int) -> set[int]:
    return {pid for pid, name in c.node_processes(number).items() if name == "httpd"}


def test_podshimd_killed_leaves_the_pods_running_and_kubelet_reconverges_without_duplicates(c) -> None:
    pods = [p for p in smoke_pods(c) if p["spec"]["nodeName"] == "node2"]
    assert pods, "no pod of the Deployment on node2"
    ids = {p["metadata"]["uid"]: kt.container(p, "web")["containerID"] for p in pods}
    running = httpd_pids(c, 2)
    assert len(running) >= len(pods)
    c.kill("node2-podshimd")
    time.sleep(5)  # the kubelet's relists fail meanwhile: nothing of the pods may change
    assert httpd_pids(c, 2) == running
    c.start("node2-podshimd")
    kt.wait_until("exec through the restarted podshimd",
                  lambda: c.kubectl("exec", pods[0]["metadata"]["name"], "--", "cat", "/www/index.html",
                                    check=False).stdout.strip(), lambda said: said == pods[0]["metadata"]["name"])
    time.sleep(10)  # a kubelet that reconverged wrongly would be making new containers by now
    for p in pods:
        now = kt.pod(c, p["metadata"]["name"])
        status = kt.container(now, "web")
        assert (status["containerID"], status["restartCount"], kt.ready(now)) == (ids[p["metadata"]["uid"]], 0, True)
        held = kt.node_containers(c, 2, p["metadata"]["uid"])
        assert [x["id"] for x in held] == [ids[p["metadata"]["uid"]].split("://")[1]], held
        assert len(kt.node_sandboxes(c, 2, p["metadata"]["uid"])) == 1
    assert httpd_pids(c, 2) == running
    assert node_ready(c, "node2")


def test_a_stopped_kubelet_makes_its_node_not_ready_and_its_pods_are_made_again_elsewhere(c) -> None:
    moved = {p["metadata"]["uid"] for p in smoke_pods(c) if p["spec"]["nodeName"] == "node2"}
    assert moved
    c.kill("node2-kubelet", signal.SIGTERM)
    kt.wait_until("node2 NotReady", lambda: node_ready(c, "node2"), lambda ready: not ready, timeout=90)
    # After the not-ready toleration (30 s) its pods are evicted and made again on node1.
    kt.wait_until("the Deployment's 6 pods Ready on node1", lambda: smoke_pods(c),
                  lambda ps: len(ps) == 6 and all(p["spec"]["nodeName"] == "node1" and kt.ready(p) for p in ps),
                  timeout=180, interval=2)
    c.start("node2-kubelet")
    kt.wait_until("node2 Ready again", lambda: node_ready(c, "node2"), timeout=90)
    # The kubelet back, the evicted pods are stopped and go from the API server and from podshimd.
    kt.wait_until("the evicted pods gone", lambda: {p["metadata"]["uid"] for p in
                                                    kt.get(c, "pods", "-l", "app=smoke")["items"]} & moved,
                  lambda left: not left, timeout=120, interval=2)
    kt.wait_until("node2's podshimd running nothing of them",
                  lambda: [x for uid in moved for x in kt.node_containers(c, 2, uid) if x["state"] == "CONTAINER_RUNNING"],
                  lambda left: not left, timeout=60, interval=2)


def test_a_rebooted_node_brings_its_pods_back(c) -> None:
    kt.apply(c, PINNED, IMAGE=harness.BUSYBOX)
    before = kt.wait_pod(c, "pinned", "running", kt.running)
    uid = before["metadata"]["uid"]
    old_sandbox = [s["id"] for s in kt.node_sandboxes(c, 2, uid)]
    c.reboot(2)
    after = kt.wait_pod(c, "pinned", "running again after the reboot",
                        lambda p: kt.running(p) and kt.container(p, "web").get("restartCount", 0) >= 1, timeout=180)
    assert after["metadata"]["uid"] == uid and after["status"]["podIP"]
    assert c.kubectl("exec", "pinned", "--", "cat", "/www/index.html").stdout.strip() == "pinned"
    ready = [s for s in kt.node_sandboxes(c, 2, uid) if s["state"] == "SANDBOX_READY"]
    assert len(ready) == 1 and ready[0]["id"] not in old_sandbox
    client = next(p["metadata"]["name"] for p in smoke_pods(c) if p["spec"]["nodeName"] == "node1")
    assert harness.http_get(c, client, after["status"]["podIP"], 8080) == "pinned"
    assert node_ready(c, "node2")


# -- kubelet's garbage collection (last: it waits for the image GC's period) ----------------------------

CRASHING = """
apiVersion: v1
kind: Pod
metadata: {name: crashing}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: IMAGE, command: ["sh", "-c", "exit 1"]}]
"""


def test_kubelets_garbage_collection_removes_dead_containers_sandboxes_and_unused_images(c) -> None:
    kt.apply(c, CRASHING, IMAGE=BUSYBOX)
    p = kt.wait_pod(c, "crashing", "restarted 3 times", lambda p: kt.container(p, "c").get("restartCount", 0) >= 3)
    uid, number = p["metadata"]["uid"], kt.node_number(c, p["spec"]["nodeName"])
    # Of the dead containers of one container the kubelet keeps the newest only.
    assert len(kt.node_containers(c, number, uid)) <= 2, kt.node_containers(c, number, uid)
    kt.delete(c, "pod", "crashing")
    kt.wait_until("podshimd holding nothing of the deleted pod", lambda: (kt.node_containers(c, number, uid),
                  kt.node_sandboxes(c, number, uid)), lambda held: held == ([], []), timeout=150, interval=3)
    # The image run once by gc-image (on node1) and unused since: gone at the image GC after 5 minutes.
    assert c.state.data["gc_image"] == GC_IMAGE  # the pod's status named it by its tag
    image_id = c.state.data["gc_image_id"]
    left = IMAGE_GC_PERIOD + 90 - (time.monotonic() - c.state.data["started"])
    kt.wait_until(f"node1's podshimd without {GC_IMAGE}", lambda: [i["id"] for i in kt.crictl(c, 1, "images")["images"]],
                  lambda ids: image_id not in ids, timeout=max(left, 30), interval=5)
    hex_ = image_id.split(":")[1]
    # Its record and its config blob are gone from podshimd's store; busybox's are still there.
    stored = c.in_node(1, ["sh", "-c", "ls /var/lib/podshim/images/records /var/lib/podshim/images/content/blobs/*"])
    assert hex_ not in stored.stdout
    assert kt.crictl(c, 1, "images")["images"][0]["id"].split(":")[1] in stored.stdout
