"""Kubernetes' node conformance specs (e2e.test) against harness clusters: podshimd nodes, then containerd nodes.

    python bench/k8s_conformance.py [--runtimes podshimd,containerd] [--nodes 2] [--procs 6]
                                    [--focus REGEX]... [--skip REGEX]

For each runtime in turn: a cluster of NODES nodes of that runtime (bench/cluster.py), the e2e
images built offline and pushed to its registry, then the pinned e2e.test (``go test -c`` of
k8s.io/kubernetes/test/e2e, built by .ci/gotool) run by the pinned ginkgo in PROCS parallel
processes (``[Serial]`` specs last, alone), in the cluster's network, with its admin kubeconfig;
then the cluster is taken down. Prints, per runtime, how many specs ran, passed, failed and were
skipped, each failed spec with the first line of its error, and the specs one runtime passed and
the other did not. ginkgo's JSON reports and e2e's logs stay in --output (default
/var/tmp/podshim-k8s-conformance).

The specs: by default every ``[sig-node] ... [Conformance]`` spec, and the ``[NodeConformance]``
specs of the Pods, Containers, Container Runtime, Kubelet, probes, lifecycle hooks, security
context, privileged and downward-API groups (exec, logs, attach and port-forward are among them);
skipped: specs of features behind a gate, alpha, beta or flaky ones, and the private-registry
specs (gcr.io credentials).

Images: e2e.test names its images by registry (test/utils/image/manifest.go); KUBE_TEST_REPO_LIST
maps every registry but two to the cluster's registry (10.99.0.1:5000/...), where this bench
pushes what the selected specs pull, built offline as tests/support/imagebuild.py builds test images:

- e2e-test-images/busybox (1.37.0-2, 1.36.1-1): Debian's dynamic busybox, every applet (each in
  /bin too, as Docker Hub's busybox has them);
- e2e-test-images/agnhost (2.66.1, 2.55): the pinned agnhost (built by .ci/gotool from the same
  Kubernetes module as e2e.test) as /agnhost, on that busybox, with the machine's curl (the hooks'
  exec handlers curl) and bash (probe specs run /bin/bash), a self-signed /localhost.crt and
  /localhost.key (the https hook specs), the user and group its Dockerfile adds, ENTRYPOINT
  /agnhost, CMD pause;
- e2e-test-images/nginx (1.27.0-2, 1.28.0-2): a stand-in on busybox (httpd on port 80 as
  process "nginx"), as critest's;
- e2e-test-images/nonewprivs:1.4 (a setuid-root program printing its effective uid) and
  nonroot:1.5 (busybox, USER 1234), as their Dockerfiles say;
- pause:3.10.2: a static pause at /pause.

Left upstream's: the invalid registry (the specs expect its pulls to fail) and the private one
(gcr.io/k8s-authenticated-test: credentials and the internet). Not built, so the specs that pull
them fail on every runtime alike, listed by the report: e2e-test-images/kitten (the ImageVolume
spec reads its Alpine /etc/os-release: an Alpine base is not built offline), glibc-dns-testing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import cluster as harness
from bench.common import run_stamp

FOCUS = (r"\[sig-node\].*\[Conformance\]",
         r"\[sig-node\] (Pods|Containers|Container Runtime|Kubelet|Probing container|Container Lifecycle Hook|"
         r"Security Context|PrivilegedPod|Downward API) .*\[NodeConformance\]")
SKIP = r"\[Feature|\[Alpha\]|\[Beta\]|\[Flaky\]|private registry"
OUTPUT = "/var/tmp/podshim-k8s-conformance"
#: Bound on one runtime's whole run of the specs.
RUN_TIMEOUT = 3 * 3600.0

REGISTRY = harness.REGISTRY
#: e2e.test's registries (manifest.go's RegistryList), mapped to the cluster's registry.
REPO_LIST = {
    "promoterE2eRegistry": f"{REGISTRY}/e2e-test-images",
    "buildImageRegistry": f"{REGISTRY}/build-image",
    "gcEtcdRegistry": f"{REGISTRY}/k8s",
    "gcRegistry": f"{REGISTRY}/k8s",
    "sigStorageRegistry": f"{REGISTRY}/sig-storage",
    "dockerLibraryRegistry": f"{REGISTRY}/library",
    "cloudProviderGcpRegistry": f"{REGISTRY}/cloud-provider-gcp",
}
E2E = REPO_LIST["promoterE2eRegistry"]

#: agnhost's Dockerfile: `adduser -u 1000 -D user-defined-in-image && addgroup -g 50000
#: group-defined-in-image && addgroup user-defined-in-image group-defined-in-image`.
AGNHOST_USER = ("user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/sh\n",
                "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n")


def log(text: str) -> None:
    print(f"k8s_conformance: {text}", file=sys.stderr, flush=True)


# -- the images ---------------------------------------------------------------------------------------

def push_images(c: harness.Cluster, directory: str) -> list[str]:
    """Build the e2e images (see the module's docstring) and push them to ``c``'s registry; their
    references."""
    from support.critools import gotool
    from support.imagebuild import (
        BUSYBOX_CONFIG,
        BUSYBOX_GROUP,
        BUSYBOX_PASSWD,
        FAKE_NGINX,
        Entry,
        ImageBuilder,
        ImageConfig,
        busybox_layer,
        dynamic_busybox,
        nnp_binary,
        shared_libraries,
        tiny_pause_binary,
        web_root,
    )

    builder = ImageBuilder(directory)
    pushed: list[str] = []

    def push(tag: str, *references: str) -> None:
        for reference in references:
            c.push(builder.layout, tag, reference)
            pushed.append(reference)

    busybox = dynamic_busybox()
    # Docker Hub's busybox (the e2e image's base) has every applet in /bin: the specs run /bin/sysctl.
    applets = subprocess.run([busybox, "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    in_bin = [Entry(f"bin/{name}", "link", target="bin/busybox")
              for name in sorted({a.rsplit("/", 1)[-1] for a in applets if not a.startswith("bin/")}
                                 - {a.rsplit("/", 1)[-1] for a in applets if a.startswith("bin/")})]
    builder.assemble("busybox", [busybox_layer(in_bin, busybox=busybox)], BUSYBOX_CONFIG)  # links in their layer
    push("busybox", f"{E2E}/busybox:1.37.0-2", f"{E2E}/busybox:1.36.1-1")
    with open(gotool.tool_path("agnhost"), "rb") as f:
        agnhost = f.read()
    curl = shutil.which("curl")
    if curl is None:
        raise RuntimeError("curl is not installed: the agnhost image carries it (the hooks' exec handlers curl)")
    with open(curl, "rb") as f:
        curl_binary = f.read()
    bash = shutil.which("bash") or "/bin/bash"
    with open(bash, "rb") as f:
        bash_binary = f.read()
    libraries = {entry.path: entry for tool in (curl, bash) for entry in shared_libraries(tool)}
    key, cert = localhost_certificate(directory)
    builder.assemble("agnhost", [[Entry("agnhost", data=agnhost, mode=0o755), Entry("agnhost-2", "symlink",
                                                                                    target="agnhost"),
                                  Entry("usr/bin/curl", data=curl_binary, mode=0o755),
                                  Entry("bin/bash", data=bash_binary, mode=0o755), *libraries.values(),
                                  Entry("localhost.crt", data=cert), Entry("localhost.key", data=key, mode=0o600),
                                  Entry("uploads", "dir"), Entry("home/user-defined-in-image", "dir", uid=1000,
                                                                 gid=1000),
                                  Entry("etc/passwd", data=(BUSYBOX_PASSWD + AGNHOST_USER[0]).encode()),
                                  Entry("etc/group", data=(BUSYBOX_GROUP + AGNHOST_USER[1]).encode())]],
                     ImageConfig(entrypoint=("/agnhost",), cmd=("pause",),
                                 exposed_ports=("80/tcp", "8080/tcp", "8081/tcp", "9376/tcp", "5000/tcp")),
                     base="busybox")
    push("agnhost", f"{E2E}/agnhost:2.66.1", f"{E2E}/agnhost:2.55")
    builder.assemble("nginx", [{**web_root("usr/share/nginx/html", "<h1>podshim e2e nginx</h1>\n"),
                                "usr/sbin/nginx": Entry("", data=FAKE_NGINX, mode=0o755), "var/run": Entry("", "dir")}],
                     ImageConfig(cmd=("/usr/sbin/nginx", "nginx: master process nginx -g daemon off;"),
                                 exposed_ports=("80/tcp",), stop_signal="SIGQUIT"), base="busybox")
    push("nginx", f"{E2E}/nginx:1.27.0-2", f"{E2E}/nginx:1.28.0-2")
    builder.assemble("nonewprivs", [{"usr/local/bin/nnp": Entry("", data=nnp_binary(directory), mode=0o4755)}],
                     ImageConfig(entrypoint=("/usr/local/bin/nnp",)), base="busybox")
    push("nonewprivs", f"{E2E}/nonewprivs:1.4")
    builder.assemble("nonroot", [], ImageConfig(user="1234"), base="busybox")
    push("nonroot", f"{E2E}/nonroot:1.5")
    builder.assemble("pause", [{"pause": Entry("", data=tiny_pause_binary(directory), mode=0o755)}],
                     ImageConfig(entrypoint=("/pause",)))
    push("pause", f"{REPO_LIST['gcRegistry']}/pause:3.10.2")
    return pushed


def localhost_certificate(directory: str) -> tuple[bytes, bytes]:
    """A key and a self-signed certificate for localhost and 127.0.0.1 (agnhost's image carries one
    as /localhost.key and /localhost.crt: the https hook specs serve with them)."""
    key, cert = os.path.join(directory, "localhost.key"), os.path.join(directory, "localhost.crt")
    harness.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", key, "-out", cert, "-days", "7", "-subj", "/CN=localhost",
                 "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
    with open(key, "rb") as k, open(cert, "rb") as c:
        return k.read(), c.read()


# -- a run --------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    runtime: str
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)   #: spec -> the first line of its error
    skipped: int = 0
    seconds: float = 0.0
    error: str = ""                                        #: why the run itself failed, if it did

    @property
    def ran(self) -> int:
        return len(self.passed) + len(self.failed)


def spec_name(report: dict[str, Any]) -> str:
    return " ".join([*(report.get("ContainerHierarchyTexts") or []), report.get("LeafNodeText", "")]).strip()


def first_error_line(report: dict[str, Any]) -> str:
    failure = report.get("Failure") or {}
    message = failure.get("Message") or report.get("State", "")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0][:300] if lines else str(report.get("State", ""))


def read_report(path: str, runtime: str) -> Outcome:
    """The specs of ginkgo's JSON report (a list of suite reports) as an Outcome."""
    outcome = Outcome(runtime)
    with open(path) as f:
        suites = json.load(f)
    for suite in suites:
        for report in suite.get("SpecReports") or []:
            if report.get("LeafNodeType") != "It":
                continue  # suite set-up nodes (a failed one fails the run: its error is the run's)
            state = report.get("State")
            if state == "passed":
                outcome.passed.append(spec_name(report))
            elif state in ("skipped", "pending"):
                outcome.skipped += 1
            else:
                outcome.failed[spec_name(report)] = f"{state}: {first_error_line(report)}"
        for report in suite.get("SpecReports") or []:
            if report.get("LeafNodeType") != "It" and report.get("State") not in ("passed", "skipped"):
                outcome.error = outcome.error or f"{report.get('LeafNodeType')}: {first_error_line(report)}"
    return outcome


def run_specs(c: harness.Cluster, runtime: str, output: str, procs: int, focus: list[str], skip: str) -> Outcome:
    from support.critools import gotool

    e2e, ginkgo = gotool.tool_path("e2e.test"), gotool.tool_path("ginkgo")
    os.makedirs(output, exist_ok=True)
    repo_list = os.path.join(output, "repo-list.yaml")
    with open(repo_list, "w") as f:
        json.dump(REPO_LIST, f, indent=1)  # JSON is YAML
    report = os.path.join(output, "report.json")  # ginkgo puts --json-report in --output-dir
    argv = ["nsenter", f"--net=/proc/{c.state.data['outer']}/ns/net", "--", ginkgo, "run", f"--procs={procs}",
            *[f"--focus={regex}" for regex in focus], f"--skip={skip}", "--no-color", "--timeout=3h",
            "--json-report=report.json", f"--output-dir={output}", "--keep-going", e2e, "--",
            f"--kubeconfig={c.admin_kubeconfig}", "--provider=skeleton", f"--kubectl-path={c.state.data['tools']['kubectl']}",
            f"--num-nodes={len(c.nodes())}", f"--report-dir={output}", "--disable-log-dump",
            "--allowed-not-ready-nodes=0", "--minStartupPods=0", "--e2e-verify-service-account=true"]
    started = time.monotonic()
    with open(os.path.join(output, "ginkgo.log"), "w") as out:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT,
                              env={**os.environ, "KUBE_TEST_REPO_LIST": repo_list})
    if not os.path.exists(report):
        with open(os.path.join(output, "ginkgo.log"), errors="replace") as f:
            tail = f.read()[-1500:]
        return Outcome(runtime, seconds=time.monotonic() - started,
                       error=f"ginkgo exited with status {done.returncode} and no report: {tail}")
    outcome = read_report(report, runtime)
    outcome.seconds = time.monotonic() - started
    return outcome


def run_runtime(runtime: str, args: argparse.Namespace) -> Outcome:
    output = os.path.join(args.output, runtime)
    shutil.rmtree(output, ignore_errors=True)
    os.makedirs(output)
    log(f"{runtime}: a cluster of {args.nodes} node(s)")
    with harness.cluster(args.nodes, f"e2e-{runtime}", runtime) as c:
        images = os.path.join(output, "images")
        os.makedirs(images)
        log(f"{runtime}: {len(push_images(c, images))} e2e images pushed")
        shutil.rmtree(images)
        log(f"{runtime}: the specs, {args.procs} processes (logs in {output})")
        outcome = run_specs(c, runtime, output, args.procs, args.focus or list(FOCUS), args.skip)
        if outcome.failed or outcome.error:
            shutil.copytree(c.state.file("logs"), os.path.join(output, "cluster-logs"), dirs_exist_ok=True)
    log(f"{runtime}: {outcome.ran} ran, {len(outcome.passed)} passed, {len(outcome.failed)} failed in "
        f"{outcome.seconds:.0f} s")
    return outcome


# -- the report -------------------------------------------------------------------------------------------

def report(outcomes: list[Outcome]) -> str:
    out = ["#### Kubernetes node conformance (e2e.test v1.37.2, offline images)", "",
           "| runtime | ran | passed | failed | skipped | minutes |", "|---|---:|---:|---:|---:|---:|"]
    for o in outcomes:
        out.append(f"| {o.runtime} | {o.ran} | {len(o.passed)} | {len(o.failed)} | {o.skipped} | {o.seconds / 60:.0f} |")
    for o in outcomes:
        if o.error:
            out += ["", f"{o.runtime}: the run failed: {o.error}"]
        if o.failed:
            out += ["", f"Failed on {o.runtime}:", ""]
            out += [f"- {name} — {line}" for name, line in sorted(o.failed.items())]
    if len(outcomes) == 2:
        a, b = outcomes
        for one, other in ((a, b), (b, a)):
            only = sorted(set(other.passed) & set(one.failed))
            out += ["", f"Passed on {other.runtime}, failed on {one.runtime}: {len(only)}"]
            out += [f"- {name}" for name in only]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/k8s_conformance.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtimes", default="podshimd,containerd", help="run against each in turn")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--procs", type=int, default=6, help="ginkgo's parallel processes")
    parser.add_argument("--focus", action="append", help="the specs to run (regex; repeatable; default: see above)")
    parser.add_argument("--skip", default=SKIP)
    parser.add_argument("--output", default=OUTPUT)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/k8s_conformance.py: run it as root (bench/cluster.py makes namespaces and cgroups)",
              file=sys.stderr)
        return 2
    load = os.getloadavg()
    outcomes = [run_runtime(runtime, args) for runtime in args.runtimes.split(",")]
    print(report(outcomes))
    print(f"\n{run_stamp(load)}; {args.procs} ginkgo processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
