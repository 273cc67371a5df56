"""podshim beside containerd + runc (and crun): the sandbox lifecycle and idle memory, in one run.

    python bench/compare/run.py [--cycles 30] [--warmup 2] [--sandboxes 1,20] [--no-memory]

As root, with the interpreter podshim is installed in. Defaults take about two minutes on a quiet
2-CPU machine.

Everything is set up by this script and torn down by it, also when it fails or is interrupted
(Ctrl-C, SIGTERM, and SIGKILL of the command too: the run is a child that gets SIGTERM when the
command dies, see :func:`supervise`):

- Debian packages containerd, runc, crun and catatonit (installed only if missing);
- a pause image built here (one layer: /usr/bin/catatonit as /pause, entrypoint ["/pause", "-P"])
  as an OCI image-layout tar, imported into
- a PRIVATE containerd: its own config, root, state and sockets under a temporary directory, CRI
  and unneeded plugins off; stopped by pid at the end. A system containerd is never touched.
  The temporary directory (``--workdir-parent``, default /var/lib, where both runtimes keep
  their state in production) holds podshim's roots too. Not /tmp: while other work churns /tmp
  on this project's machines, a file made there has cost 0.1-0.3 ms at times (against 17 µs in
  /var/lib of the same filesystem; at quiet times both cost 15-25 µs), which says nothing of
  either runtime; the report prints what making a file cost in both places at its start.
  containerd 1.6 puts shim sockets in /run/containerd/s whatever its state directory: those
  directories, and runc's cgroup parent ``podshim-bench``, are removed if this run made them;
- podshim's runtime roots, one per podshim contender; the shim template the default Controller
  starts on its own runtime root is stopped by pid at the end (``stop_template``).

Lifecycle, interleaved: each round runs one cycle of every contender, the order rotated every
round, so the machine's noise hits all of them alike. Contenders:

- containerd + runc: ``ctr run -d --null-io`` → ``ctr task kill -s TERM`` → wait for the pause to
  exit → ``ctr task delete`` → ``ctr container delete``;
- containerd + crun: the same with crun as the runc binary (wrapped when the machine's cgroups
  are hybrid, which crun refuses: see ``crun_binary``);
- podshim, default: ``Controller(state_root, runtime_root)`` as a new user embeds it, nothing
  started by hand: create (new netns) → start → stop → shutdown. Its first spawn starts the
  runtime root's shim template (a warm-up cycle; the first cycle's time is reported apart), every
  later shim is forked from it;
- podshim, exec: the same with ``Controller(template=False)``: ``podshim start`` per shim (Python
  started as ``python -I -S`` with an explicit path);
- floor: ``unshare --fork --pid --net --ipc --uts --mount --mount-proc catatonit -P`` → TERM → wait;
- floor + a sandbox cgroup: the same, moved before its exec into a new cgroup in every hierarchy
  by cgroup.procs writes (as runc does), which is removed after the exit; the cgroups' parent is
  made once and kept for the run (as podshim's template keeps podshim/<namespace>);
- floor + a sandbox cgroup, entered as podshim does: the same, born in the v2 directory (clone3)
  and moving its one thread into each v1 directory (``tasks``): no cgroup.procs write, so no wait
  for the RCU grace period the kernel's global cgroup lock costs a cold writer (6-8 ms here).

Idle memory: K sandboxes of each kind at a time (one kind at a time), RSS and PSS of every shim
and every pause from /proc/PID/smaps_rollup.

Prints a markdown report and writes it to bench/results/compare-<date>.md.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import dataclasses
import datetime
import functools
import gzip
import hashlib
import io
import json
import os
import platform
import secrets
import shutil
import signal
import site
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from shim.launch.template import stop_template

from bench.common import (
    Memory,
    children_of,
    compile_bytecode,
    floor_cgroup_cycle,
    floor_cycle,
    handles_signal,
    memory,
    not_root,
    parent_of,
    percentile,
    signal_pid,
    template_memory,
    wait_pidfd,
)

NAMESPACE = "podshim-bench"
IMAGE = "podshim.local/pause:bench"
PAUSE_SOURCE = "/usr/bin/catatonit"
PACKAGES = {"containerd": "containerd", "ctr": "containerd", "containerd-shim-runc-v2": "containerd",
            "runc": "runc", "crun": "crun", "catatonit": "catatonit", "unshare": "util-linux"}
#: Grace between SIGTERM and SIGKILL for every contender's stop.
STOP_GRACE = 2.0
#: Bound on any one command or wait of the setup and teardown.
TIMEOUT = 30.0
#: How long idle sandboxes sit before their memory is read.
SETTLE = 1.0
CGROUP_ROOT = "/sys/fs/cgroup"
#: containerd 1.6 puts shim sockets here whatever its state dir is (pkg/shim socketRoot).
CONTAINERD_SOCKET_DIRS = ("/run/containerd", "/run/containerd/s")

CRUN_WRAPPER_C = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <sys/mount.h>
#include <unistd.h>
/* crun in a private mount namespace where the controller list of a hybrid host's cgroup2
   hierarchy reads empty (/dev/null bound over it): crun then accepts the hybrid layout and
   drives every hierarchy, v1 and the cgroup2 one, as runc does. The bind is only made once the
   copy of the mount table is private, so it can never propagate to the host. */
int main(int argc, char **argv) {
    (void)argc;
    if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0)
        mount("/dev/null", "@CONTROLLERS@", NULL, MS_BIND, NULL);
    execv("@CRUN@", argv);
    perror("crun-hybrid: exec");
    return 127;
}
"""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(5)}"


def run(argv: list[str], *, timeout: float = TIMEOUT, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise RuntimeError(f"{' '.join(argv[:6])} ... exited with status {done.returncode}: {said[-600:]}")
    return done


def kill_leftovers(workdir: str) -> None:
    """Kill what still names ``workdir`` (:func:`sweep`), saying so."""
    for killed in sweep(workdir):
        log(f"killed leftover {killed}")


def _same_cmdline(pid: int, argv: list[str]) -> bool:
    return cmdline(pid) == argv


def _child_of(pid: int, shim: int) -> bool:
    return parent_of(pid) == shim


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


# -- cleanup -------------------------------------------------------------------------------------

class Janitor:
    """Undo steps, run last-in first-out exactly once: at the end of main, at exit, or on a signal."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []
        self._state = "armed"
        self.failures: list[str] = []

    def add(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        self._steps.append((what, fn, args))

    def workdir(self, prefix: str, parent: str | None = None) -> str:
        """A new work directory (``prefix`` + random, in ``parent`` or the temporary directory),
        removed with all it holds when the janitor runs."""
        path = tempfile.mkdtemp(prefix=prefix, dir=parent)
        self.add("remove the work directory", shutil.rmtree, path, True)
        return path

    def problems(self) -> list[str]:
        """The line a bench's report ends with when a cleanup step failed; none when all went well."""
        return ["Cleanup problems: " + "; ".join(self.failures)] if self.failures else []

    def run(self) -> None:
        if self._state != "armed":
            return
        self._state = "running"
        while self._steps:
            what, fn, args = self._steps.pop()
            try:
                fn(*args)
            except BaseException as exc:  # keep going: every later step still has to run
                self.failures.append(f"{what}: {exc}")
                log(f"cleanup: {what} failed: {exc}")
        self._state = "done"

    def install(self) -> None:
        atexit.register(self.run)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._state == "running":
            return  # already cleaning up: let it finish
        log(f"\n{signal.Signals(signum).name}: cleaning up")
        self.run()
        os._exit(128 + signum)


def stop_process(proc: subprocess.Popen[bytes], what: str, grace: float = 10.0) -> None:
    """SIGTERM by pid, then SIGKILL; reaps it."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        log(f"{what} (pid {proc.pid}) ignored SIGTERM for {grace:.0f}s: SIGKILL")
        proc.kill()
        proc.wait()


def sweep(marker: str) -> list[str]:
    """SIGKILL every process whose command line names ``marker`` (our unique work directory), and
    its descendants (pauses that would be orphaned). Returns what was killed."""
    me = os.getpid()
    roots = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me
             and any(marker in arg for arg in cmdline(int(p)))]
    victims: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in victims:
            victims.append(pid)
            todo.extend(children_of(pid))
    killed = []
    for pid in reversed(victims):  # children first
        argv = cmdline(pid)
        if signal_pid(pid, signal.SIGKILL, functools.partial(_same_cmdline, argv=argv)):
            killed.append(f"{pid} {' '.join(argv)[:80]}")
    return killed


def unmount_under(directory: str) -> None:
    """Lazily unmount anything still mounted below ``directory`` (deepest first)."""
    from shim.lib import mountinfo

    points = [mount.mount_point for mount in mountinfo.read()]
    for point in sorted((p for p in points if p.startswith(directory + "/")), key=len, reverse=True):
        run(["umount", "-l", point], check=False)


def remove_if_ours(paths: list[str], existed: set[str]) -> None:
    """rmdir (never more) the directories of ``paths`` that did not exist before we started."""
    for path in paths:
        if path not in existed:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log(f"left {path} in place: {exc.strerror}")


# -- setup ---------------------------------------------------------------------------------------

def ensure_packages() -> str:
    missing = sorted({pkg for binary, pkg in PACKAGES.items() if shutil.which(binary) is None})
    if not missing:
        return "all present"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if run(argv, check=False, timeout=600, env=env).returncode != 0:
        run(["apt-get", "update"], timeout=600, env=env)
        run(argv, timeout=600, env=env)
    return "installed " + ", ".join(missing)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def build_pause_image(path: str, pause_binary: str = PAUSE_SOURCE) -> str:
    """Write a one-layer OCI image-layout tar holding ``pause_binary`` as /pause; return the
    manifest digest. Byte-for-byte reproducible (mtimes 0)."""
    with open(pause_binary, "rb") as f:
        pause = f.read()
    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_member(tar, "pause", pause, 0o755)
    diff = layer_tar.getvalue()
    layer = gzip.compress(diff, mtime=0)
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    config = json.dumps({
        "architecture": arch, "os": "linux",
        "config": {"Entrypoint": ["/pause", "-P"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(diff)]},
        "history": [{"created_by": f"podshim bench: {pause_binary} as /pause"}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": _digest(layer),
                    "size": len(layer)}],
    }, sort_keys=True).encode()
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _digest(manifest),
                       "size": len(manifest), "platform": {"architecture": arch, "os": "linux"}}],
    }, sort_keys=True).encode()
    with tarfile.open(path, "w") as tar:
        _tar_member(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _tar_member(tar, "index.json", index)
        for blob in (config, manifest, layer):
            _tar_member(tar, "blobs/sha256/" + _digest(blob)[len("sha256:"):], blob)
    return _digest(manifest)


#: The cgroup2 hierarchy's controller list on a hybrid host: crun refuses the layout unless it is empty.
HYBRID_CONTROLLERS = f"{CGROUP_ROOT}/unified/cgroup.controllers"


def hybrid_cgroups() -> bool:
    """v1 hierarchies under a tmpfs /sys/fs/cgroup plus a cgroup2 mount holding controllers."""
    with open("/proc/self/mounts") as f:
        types = {fields[1]: fields[2] for fields in (line.split() for line in f)}
    if types.get(CGROUP_ROOT) != "tmpfs" or types.get(f"{CGROUP_ROOT}/unified") != "cgroup2":
        return False
    try:
        with open(HYBRID_CONTROLLERS) as f:
            return bool(f.read().split())
    except OSError:
        return False


def crun_binary(workdir: str) -> tuple[str | None, str]:
    """The runc binary to give containerd for crun, and a note on how crun is run.

    crun 1.8 refuses hybrid cgroups ("cgroups in hybrid mode not supported") while the cgroup2
    hierarchy has a controller (hugetlb here), even with ``--cgroup-manager=disabled``. The way
    around that leaves the host alone: a wrapper that runs crun in a private mount namespace where
    that hierarchy's ``cgroup.controllers`` reads empty, as the shim does for its own crun calls
    (shim.runtime.oci). crun then makes the container's cgroup in every hierarchy, as runc does.
    (Unmounting the cgroup2 hierarchy instead, as this bench once did, left crun writing its
    "cgroup" for it into the tmpfs directory under the mount point, and failed on a machine where
    that directory had no parent for it.)
    """
    crun = shutil.which("crun")
    if crun is None:
        return None, "crun is not installed"
    if not hybrid_cgroups():
        return crun, "crun as installed"
    wrapper = os.path.join(workdir, "crun-hybrid")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        source = wrapper + ".c"
        with open(source, "w") as f:
            f.write(CRUN_WRAPPER_C.replace("@CRUN@", crun).replace("@CONTROLLERS@", HYBRID_CONTROLLERS))
        run([cc, "-O2", "-o", wrapper, source])
        return wrapper, ("hybrid cgroups: crun run through a tiny C wrapper (one extra exec) in a private "
                         "mount namespace where the cgroup2 hierarchy's controller list reads empty, so it "
                         "accepts the hybrid layout and makes its cgroups in every hierarchy, as runc does")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nexec unshare --mount --propagation private /bin/sh -c "
                f"'mount --bind /dev/null {HYBRID_CONTROLLERS} && exec {crun} \"$@\"' crun \"$@\"\n")
    os.chmod(wrapper, 0o755)
    return wrapper, ("hybrid cgroups: crun run through a shell wrapper (unshare + sh + mount: about three extra "
                     "execs per crun call) in a private mount namespace where the cgroup2 hierarchy's controller "
                     "list reads empty, so it makes its cgroups in every hierarchy, as runc does")


# -- containerd --------------------------------------------------------------------------------------

class PrivateContainerd:
    """A containerd of our own: config, root, state and sockets under ``directory``."""

    def __init__(self, directory: str, janitor: Janitor):
        self.dir = directory
        self.sock = os.path.join(directory, "containerd.sock")
        self.janitor = janitor
        self.proc: subprocess.Popen[bytes] | None = None
        self.live: set[str] = set()  # container ids that may exist
        # runc's cgroup parent for the namespace (cgroupsPath /NAMESPACE/ID), v2 or any v1 hierarchy
        self.cgroup_dirs = [os.path.join(CGROUP_ROOT, NAMESPACE)] + [
            os.path.join(CGROUP_ROOT, h, NAMESPACE) for h in sorted(os.listdir(CGROUP_ROOT))
            if h != NAMESPACE and os.path.isdir(os.path.join(CGROUP_ROOT, h))]
        self.existed = {p for p in (*CONTAINERD_SOCKET_DIRS, *self.cgroup_dirs) if os.path.exists(p)}

    def config(self) -> str:
        disabled = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt", "io.containerd.internal.v1.tracing",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.native"]
        return "\n".join([
            "version = 2",
            f'root = "{self.dir}/root"',
            f'state = "{self.dir}/state"',
            f'temp = "{self.dir}/tmp"',
            'plugin_dir = ""',
            "disabled_plugins = [" + ", ".join(f'"{p}"' for p in disabled) + "]",
            "[grpc]", f'  address = "{self.sock}"',
            "[ttrpc]", f'  address = "{self.sock}.ttrpc"',
            "[debug]", '  address = ""', '  level = "warn"',
            "[metrics]", '  address = ""', "",
        ])

    def start(self) -> str:
        os.makedirs(os.path.join(self.dir, "tmp"), exist_ok=True)
        config = os.path.join(self.dir, "config.toml")
        with open(config, "w") as f:
            f.write(self.config())
        logf = open(os.path.join(self.dir, "containerd.log"), "ab")
        self.janitor.add("remove containerd's own directories", remove_if_ours,
                         [*reversed(CONTAINERD_SOCKET_DIRS), *self.cgroup_dirs], self.existed)
        self.proc = subprocess.Popen([shutil.which("containerd") or "containerd", "--config", config], stdin=subprocess.DEVNULL,
                                     stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        logf.close()
        self.janitor.add("stop containerd", self.stop)
        deadline = time.monotonic() + TIMEOUT
        while True:
            done = run(["ctr", "-a", self.sock, "version"], check=False)
            if done.returncode == 0:
                version: str = done.stdout.split("Server:")[-1].split("Version:")[1].split()[0]
                return version
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not come up: {self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "containerd.log")) as f:
                return f.read()[-1500:]
        except OSError:
            return "(no log)"

    def ctr(self, *args: str, check: bool = True, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
        return run(["ctr", "-a", self.sock, "-n", NAMESPACE, *args], check=check, timeout=timeout)

    def bundle(self, cid: str) -> str:
        return os.path.join(self.dir, "state", "io.containerd.runtime.v2.task", NAMESPACE, cid)

    def is_our_shim(self, pid: int) -> bool:
        argv = cmdline(pid)
        return bool(argv) and "containerd-shim" in argv[0] and self.sock in argv

    def run_task(self, cid: str, runtime_flags: list[str]) -> None:
        self.live.add(cid)
        self.ctr("run", "-d", "--null-io", *runtime_flags, IMAGE, cid)

    def task_pids(self, cid: str) -> tuple[int, int]:
        """(pause pid, shim pid) of a running task: the shim's init.pid, and its parent."""
        with open(os.path.join(self.bundle(cid), "init.pid")) as f:
            pause = int(f.read())
        shim = parent_of(pause)
        if not self.is_our_shim(shim):
            raise RuntimeError(f"the parent of {cid}'s pause ({shim}) is not a shim of our containerd")
        return pause, shim

    def delete_task(self, cid: str) -> None:
        """``ctr task delete`` once containerd has seen the exit (it may lag the process by a hair)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            done = self.ctr("task", "delete", cid, check=False)
            if done.returncode == 0:
                return
            if "running" not in done.stderr or time.monotonic() > deadline:
                raise RuntimeError(f"ctr task delete {cid}: {done.stderr.strip()}")
            time.sleep(0.001)

    def remove(self, cid: str) -> None:
        self.ctr("container", "delete", cid)
        self.live.discard(cid)

    def force_remove(self, cid: str) -> None:
        self.ctr("task", "delete", "--force", cid, check=False)
        self.ctr("container", "delete", cid, check=False)
        self.live.discard(cid)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            for cid in sorted(self.live):
                self.force_remove(cid)
        stop_process(self.proc, "containerd")
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            if self.is_our_shim(pid):  # a shim that outlived its task: its pause first
                for child in children_of(pid):
                    signal_pid(child, signal.SIGKILL, functools.partial(_child_of, shim=pid))
                signal_pid(pid, signal.SIGKILL, self.is_our_shim)
                log(f"killed a leftover containerd shim, pid {pid}")


# -- contenders ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Sample:
    start: float
    stop: float
    remove: float
    killed: bool = False  # SIGTERM was not enough: SIGKILL after STOP_GRACE
    parts: dict[str, float] = dataclasses.field(default_factory=dict)  # where the start phase went

    @property
    def total(self) -> float:
        return self.start + self.stop + self.remove


@dataclasses.dataclass
class Idle:
    """What K idle sandboxes of one kind cost."""

    shims: list[Memory]
    pauses: list[Memory]
    fixed: dict[str, Memory]  # not per sandbox: the daemon, the template


class Contender:
    key = ""
    label = ""
    how = ""
    measures_memory = False

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.error: str | None = None

    async def cycle(self) -> Sample:
        raise NotImplementedError

    async def idle(self, count: int) -> Idle:
        raise NotImplementedError


class Containerd(Contender):
    def __init__(self, cd: PrivateContainerd, key: str, label: str, runc_binary: str | None, root: str,
                 measures_memory: bool):
        super().__init__()
        self.cd, self.key, self.label = cd, key, label
        self.flags = ["--runc-root", root] + (["--runc-binary", runc_binary] if runc_binary else [])
        self.how = ("`ctr run -d --null-io` → `ctr task kill -s TERM` → pause exited → `ctr task delete` → "
                    "`ctr container delete`")
        self.measures_memory = measures_memory
        self.early = 0  # cycles where the pause did not handle SIGTERM yet when `ctr run -d` returned

    async def cycle(self) -> Sample:
        cid = new_id("cd")
        t0 = time.perf_counter()
        self.cd.run_task(cid, self.flags)
        t1 = time.perf_counter()
        pause, shim = self.cd.task_pids(cid)
        pause_fd, shim_fd = os.pidfd_open(pause), os.pidfd_open(shim)
        try:
            # `ctr run -d` returns once runc started the task, not once the pause handles SIGTERM: a
            # TERM sent before then is dropped (PID 1 of a pid namespace). Waited out, untimed.
            if not handles_signal(pause, signal.SIGTERM, "pause"):
                self.early += 1
                deadline = time.monotonic() + TIMEOUT
                while not handles_signal(pause, signal.SIGTERM, "pause") and time.monotonic() < deadline:
                    time.sleep(0.0005)
            t2 = time.perf_counter()
            self.cd.ctr("task", "kill", "-s", "TERM", cid)
            killed = not wait_pidfd(pause_fd, STOP_GRACE)
            if killed:
                self.cd.ctr("task", "kill", "-s", "KILL", cid, check=False)
                if not wait_pidfd(pause_fd, TIMEOUT):
                    raise RuntimeError(f"the pause of {cid} outlived SIGKILL")
            t3 = time.perf_counter()
            self.cd.delete_task(cid)
            self.cd.remove(cid)
            t4 = time.perf_counter()
            wait_pidfd(shim_fd, TIMEOUT)  # untimed: the next cycle starts on a quiet machine
        finally:
            os.close(pause_fd)
            os.close(shim_fd)
        return Sample(t1 - t0, t3 - t2, t4 - t3, killed)

    async def idle(self, count: int) -> Idle:
        cids = [new_id("cdm") for _ in range(count)]
        try:
            for cid in cids:
                self.cd.run_task(cid, self.flags)
            await asyncio.sleep(SETTLE)
            pids = [self.cd.task_pids(cid) for cid in cids]
            assert self.cd.proc is not None  # (started)
            return Idle(shims=[memory(shim) for _, shim in pids], pauses=[memory(pause) for pause, _ in pids],
                        fixed={"containerd daemon": memory(self.cd.proc.pid)})
        finally:
            for cid in cids:
                if cid in self.cd.live:
                    self.cd.force_remove(cid)


def timed_spawner(runtime_root: str, template: bool) -> Any:
    """The Controller's own spawner (``Controller(runtime_root=..., template=...)`` makes exactly
    this ExecSpawner), remembering how long its last spawn took."""
    from client.controller.spawners import ExecSpawner, Spawner

    class TimedSpawner(Spawner):
        def __init__(self) -> None:
            self.inner = ExecSpawner(runtime_root=runtime_root, use_template=template)
            self.last = 0.0

        async def spawn(self, namespace: str, sandbox_id: str, bundle: str) -> Any:
            t0 = time.perf_counter()
            try:
                return await self.inner.spawn(namespace, sandbox_id, bundle)
            finally:
                self.last = time.perf_counter() - t0

        async def delete(self, namespace: str, sandbox_id: str, bundle: str) -> Any:
            return await self.inner.delete(namespace, sandbox_id, bundle)

        async def release(self, namespace: str, sandbox_id: str) -> None:
            await self.inner.release(namespace, sandbox_id)

    return TimedSpawner()


class Podshim(Contender):
    measures_memory = True

    def __init__(self, key: str, label: str, controller: Any, template: bool):
        super().__init__()
        self.key, self.label, self.c, self.template = key, label, controller, template
        self.how = ("Controller: create (" + ("the Spawn of the runtime root's template, which the first spawn "
                                             "started" if template else "`podshim start`")
                    + ", CreateSandbox, new netns) + start → stop (TERM) → shutdown (shim gone)")
        self.netns_seen: set[str] = set()
        self.pause_binary = ""
        self.first: float | None = None  # the very first cycle's start phase (it starts the template)

    def _state(self, sid: str) -> dict[str, Any]:
        from shim.api.paths import STATE_FILE
        from shim.lib.files import read_json

        from client.controller.bundles import bundle_path

        record: dict[str, Any] = read_json(os.path.join(bundle_path(self.c.state_root, NAMESPACE, sid), STATE_FILE))
        if record.get("netns_path"):
            self.netns_seen.add(record["netns_path"])
        self.pause_binary = (record.get("pause") or {}).get("binary") or self.pause_binary
        return record

    async def cycle(self) -> Sample:
        sid = new_id("ps")
        t0 = time.perf_counter()
        await self.c.create(NAMESPACE, sid)
        tc = time.perf_counter()
        await self.c.start(NAMESPACE, sid)
        t1 = time.perf_counter()
        spawn = self.c.spawner.last
        if self.first is None:
            self.first = t1 - t0
        parts = {"spawn": spawn, "bundle, connect, CreateSandbox": tc - t0 - spawn, "StartSandbox": t1 - tc}
        shim_fd = os.pidfd_open(self._state(sid)["shim_pid"])
        try:
            t2 = time.perf_counter()
            await self.c.stop(NAMESPACE, sid, timeout=STOP_GRACE)
            t3 = time.perf_counter()
            await self.c.shutdown(NAMESPACE, sid)
            t4 = time.perf_counter()
            wait_pidfd(shim_fd, TIMEOUT)  # untimed, as for containerd
        finally:
            os.close(shim_fd)
        return Sample(t1 - t0, t3 - t2, t4 - t3, t3 - t2 >= STOP_GRACE, parts)

    async def idle(self, count: int) -> Idle:
        sids = [new_id("psm") for _ in range(count)]
        made = []
        try:
            pids = []
            for sid in sids:
                await self.c.create(NAMESPACE, sid)
                made.append(sid)
                instance = await self.c.start(NAMESPACE, sid)
                pids.append((instance.pid, self._state(sid)["shim_pid"]))
            await asyncio.sleep(SETTLE)
            from shim.launch.template import template_pid

            pid = template_pid(self.c.runtime_root) if self.template else 0
            fixed = ({f"the template of “{self.label}” (with its spare shim)": template_memory(pid, self.c.runtime_root)}
                     if pid else {})
            return Idle(shims=[memory(shim) for _, shim in pids], pauses=[memory(pause) for pause, _ in pids],
                        fixed=fixed)
        finally:
            for sid in made:
                await self.c.shutdown(NAMESPACE, sid)


class Floor(Contender):
    key, label = "floor", "floor: unshare + catatonit"
    how = "`unshare --fork --pid --net --ipc --uts --mount --mount-proc catatonit -P` → TERM → wait"

    async def cycle(self) -> Sample:
        start, stop = floor_cycle()
        return Sample(start, stop, 0.0)


class FloorCgroup(Contender):
    key, label = "floor-cgroup", "floor + a sandbox cgroup"
    how = ("the floor, with a new cgroup in every hierarchy (mkdir; its parent made once and kept, as podshim's "
           "template keeps podshim/<namespace>), unshare moved into it by cgroup.procs writes before its exec "
           "(as runc does), and the rmdir after the exit: the kernel's cost of the cgroup every runtime makes for "
           "a sandbox")
    lock_free = False

    def __init__(self) -> None:
        super().__init__()
        self.parent = f"podshim-bench-floor-{secrets.token_hex(3)}"
        self.hold: Any = None

    async def cycle(self) -> Sample:
        if self.hold is None:
            from shim.kernel.cgroups import hold_parent

            self.hold = hold_parent(self.parent)
        start, stop, remove = floor_cgroup_cycle(self.parent, lock_free=self.lock_free)
        return Sample(start, stop, remove)

    def release(self) -> None:
        """Remove the hold on the parent, and so the parent."""
        if self.hold is not None:
            self.hold.remove()
            self.hold = None


class FloorCgroupLockFree(FloorCgroup):
    key, label = "floor-cgroup-lockfree", "floor + a sandbox cgroup, entered as podshim does"
    how = ("the same, but unshare is born in the v2 directory (clone3 CLONE_INTO_CGROUP) and writes \"0\" to "
           "each v1 `tasks` file itself: no cgroup.procs write, so no wait for the kernel's RCU grace period "
           "(what podshim's launch does since this change)")
    lock_free = True


@dataclasses.dataclass(frozen=True)
class PythonCommand:
    """How podshim is run: ``argv`` + action; ``env`` None means ours."""

    argv: list[str]
    env: dict[str, str] | None = None


def podshim_commands() -> dict[str, PythonCommand]:
    """How a ``podshim`` helper can be started (bench/shim_cycle.py runs both). "site": ``python -m
    shim`` with site, as a console script starts, every site-packages start-up hook (.pth file)
    included. "bare": the command line the Controller runs, ``python -I -S`` with an explicit path."""
    from shim.lib.program import podshim_argv

    site_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    return {"site": PythonCommand([sys.executable, "-m", "shim"], site_env), "bare": PythonCommand(podshim_argv())}


def startup_hooks() -> list[str]:
    """The .pth files of site-packages that run code at every interpreter start."""
    found = []
    for directory in site.getsitepackages():
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            if name.endswith(".pth"):
                with open(os.path.join(directory, name), errors="replace") as f:
                    if any(line.startswith(("import ", "import\t")) for line in f):
                        found.append(name)
    return found


def interpreter_start(rounds: int = 5) -> tuple[float, float]:
    """Median seconds of ``python -c pass`` and of ``python -I -S -c pass``, interleaved."""
    plain: list[float] = []
    bare: list[float] = []
    for _ in range(rounds):
        for argv, into in (([sys.executable, "-c", "pass"], plain), ([sys.executable, "-I", "-S", "-c", "pass"], bare)):
            t0 = time.perf_counter()
            subprocess.run(argv, check=True)
            into.append(time.perf_counter() - t0)
    return statistics.median(plain), statistics.median(bare)


def delete_leftover_sandboxes(state_root: str, runtime_root: str) -> None:
    """`podshim delete` for every bundle still under ``state_root`` (kills shim and pause, removes
    the netns and cgroup they made)."""
    directory = os.path.join(state_root, NAMESPACE)
    for sid in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if sid.startswith("."):
            continue
        run([sys.executable, "-m", "shim", "delete", "--namespace", NAMESPACE, "--id", sid, "--bundle",
             os.path.join(directory, sid), "--runtime-root", runtime_root], cwd=REPO, check=False)
        log(f"podshim delete ran for leftover sandbox {sid}")


# -- the run ---------------------------------------------------------------------------------------

def cpu_times() -> list[int]:
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


async def measure(contenders: list[Contender], cycles: int, warmup: int) -> tuple[float, dict[str, float]]:
    """Warm-up, then ``cycles`` interleaved rounds. Returns the seconds taken and CPU shares."""
    for c in contenders:
        for _ in range(warmup):
            try:
                await c.cycle()
            except Exception as exc:
                c.error = f"{type(exc).__name__}: {exc}"
                log(f"{c.label}: cannot run it, skipped: {c.error}")
                break
    active = [c for c in contenders if c.error is None]
    before, t0 = cpu_times(), time.perf_counter()
    for n in range(cycles):
        shift = n % len(active)
        for c in active[shift:] + active[:shift]:
            if c.error is not None:
                continue
            try:
                c.samples.append(await c.cycle())
            except Exception as exc:
                c.error = f"failed in round {n + 1}: {type(exc).__name__}: {exc}"
                log(f"{c.label}: {c.error}")
        if (n + 1) % 10 == 0:
            log(f"  {n + 1}/{cycles} rounds")
    took = time.perf_counter() - t0
    delta = [b - a for a, b in zip(before, cpu_times(), strict=False)]
    total = sum(delta) or 1
    # /proc/stat: user nice system idle iowait irq softirq steal ...
    shares = {"busy": 1 - (delta[3] + delta[4]) / total, "steal": (delta[7] if len(delta) > 7 else 0) / total}
    return took, shares


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def mib(kib: float) -> str:
    return f"{kib / 1024:.2f}"


def mean_memory(rows: list[Memory]) -> tuple[float, float, float]:
    return (statistics.fmean(m.rss for m in rows), statistics.fmean(m.pss for m in rows),
            statistics.fmean(m.threads for m in rows))


def _median(c: Contender, part: str = "total") -> float:
    return float(statistics.median(getattr(s, part) for s in c.samples))


def _plural(count: int) -> str:
    return f"{count} sandbox{'es' if count > 1 else ''}"


def _lifecycle_section(contenders: list[Contender], base_med: float | None) -> list[str]:
    out = ["#### Sandbox lifecycle, whole cycle (ms)", "",
           "| contender | median | p90 | min | max | ÷ containerd+runc | SIGKILL needed |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for c in contenders:
        if not c.samples:
            out.append(f"| {c.label} | — | — | — | — | — | did not run: {c.error} |")
            continue
        totals = [s.total for s in c.samples]
        ratio = f"{_median(c) / base_med:.2f}" if base_med else "—"
        out.append(f"| {c.label} | {ms(_median(c))} | {ms(percentile(totals, 90))} | {ms(min(totals))} | "
                   f"{ms(max(totals))} | {ratio} | {sum(s.killed for s in c.samples)}/{len(c.samples)} |")
    out += ["", "#### Phases (median ms)", "",
            "| contender | start (to pause running) | stop (TERM to exited) | remove | how |", "|---|---:|---:|---:|---|"]
    ran = [c for c in contenders if c.samples]
    for c in ran:
        out.append(f"| {c.label} | {ms(_median(c, 'start'))} | {ms(_median(c, 'stop'))} | "
                   f"{ms(_median(c, 'remove'))} | {c.how} |")
    split = [c for c in ran if c.samples[0].parts]
    if split:
        names = list(split[0].samples[0].parts)
        out += ["", "Where podshim's start phase goes (median ms; spawn = the `podshim start` helper until it "
                "printed the address):", "", "| contender | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for c in split:
            out.append(f"| {c.label} | "
                       + " | ".join(ms(statistics.median(s.parts[n] for s in c.samples)) for n in names) + " |")
    return out


def _memory_section(idle: dict[int, dict[str, Idle]], labels: dict[str, str]) -> list[str]:
    out = ["#### Idle memory per sandbox (MiB, mean over the sandboxes; smaps_rollup)", "",
           "| sandboxes | kind | shim RSS | shim PSS | pause RSS | pause PSS | RSS total | PSS total | "
           "shim threads | shim PSS ÷ containerd's |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    fixed = []
    for count, kinds in idle.items():
        base_pss = mean_memory(kinds["runc"].shims)[1] if "runc" in kinds else None
        for key, result in kinds.items():
            srss, spss, threads = mean_memory(result.shims)
            prss, ppss, _ = mean_memory(result.pauses)
            ratio = f"{spss / base_pss:.2f}" if base_pss else "—"
            out.append(f"| {count} | {labels[key]} | {mib(srss)} | {mib(spss)} | {mib(prss)} | {mib(ppss)} "
                       f"| {mib(srss + prss)} | {mib(spss + ppss)} | {threads:.0f} | {ratio} |")
            fixed += [f"{what} with {_plural(count)}: RSS {mib(m.rss)}, PSS {mib(m.pss)} MiB"
                      for what, m in result.fixed.items()]
    out += ["", "Not per sandbox (fixed costs): " + "; ".join(fixed) + ". The bench process itself is Python too "
            "and shares the interpreter's pages with the podshim shims, which lowers their PSS a little, as a "
            "Python controller would on a node."]
    return out


def _targets_section(contenders: list[Contender], base_med: float | None, idle: dict[int, dict[str, Idle]],
                     labels: dict[str, str]) -> list[str]:
    out = ["#### Targets", ""]
    floors = {c.key: _median(c) for c in contenders if isinstance(c, (Floor, FloorCgroup)) and c.samples}
    for c in contenders:
        # The targets are the default Controller's: what a new user gets without starting anything.
        if isinstance(c, Podshim) and c.key == "default" and c.samples and base_med:
            speedup = base_med / _median(c)
            out.append(f"- {c.label}: cycle {speedup:.2f}x as fast as containerd+runc's (target ≥ 8x): "
                       f"**{'met' if speedup >= 8 else 'not met'}**.")
            if floors.get("floor-cgroup"):
                times = _median(c) / floors["floor-cgroup"]
                out.append(f"- {c.label}: cycle {times:.2f}x the floor with a sandbox cgroup (target ≤ 1.5x): "
                           f"**{'met' if times <= 1.5 else 'not met'}**"
                           + (f"; {_median(c) / floors['floor-cgroup-lockfree']:.2f}x the floor with a sandbox "
                              "cgroup entered as podshim enters it" if floors.get("floor-cgroup-lockfree") else "")
                           + (f"; {_median(c) / floors['floor']:.2f}x the bare unshare floor." if floors.get("floor")
                              else "."))
    for count, kinds in idle.items():
        base_pss = mean_memory(kinds["runc"].shims)[1] if "runc" in kinds else None
        for key, result in kinds.items():
            if base_pss and key != "runc":
                pss = mean_memory(result.shims)[1]
                out.append(f"- {labels[key]}, {_plural(count)}: shim PSS {mib(pss)} MiB vs containerd-shim-runc-v2's "
                           f"{mib(base_pss)} MiB (target ≤): **{'met' if pss <= base_pss else 'not met'}**.")
    return out


def report(info: dict[str, Any], contenders: list[Contender], idle: dict[int, dict[str, Idle]]) -> str:
    labels = {c.key: c.label for c in contenders}
    base = next(c for c in contenders if c.key == "runc")
    base_med = _median(base) if base.samples else None
    out = [f"### podshim beside containerd + runc ({info['date']})", "",
           f"Machine: {info['nproc']} CPUs ({info['cpu']}), kernel {info['kernel']}, {info['os']}; "
           f"Python {platform.python_version()}; containerd {info['containerd']}, runc {info['runc']}, "
           f"crun {info['crun']}, catatonit {info['catatonit']}.",
           f"Method: {info['cycles']} cycles of each contender after {info['warmup']} warm-up cycles each, "
           "interleaved round robin with the order rotated every round, so the machine's noise hits every "
           "contender alike; wall clock of each phase, medians and p90 (nearest rank). Noise during the "
           f"rounds: CPUs {info['busy']:.0%} busy, {info['steal']:.1%} steal; load average "
           f"{info['load_before']:.2f} before, {info['load_after']:.2f} after (other work on the machine "
           "counts in every figure alike).", ""]
    out += _lifecycle_section(contenders, base_med)
    if idle:
        out += [""] + _memory_section(idle, labels)
    out += [""] + _targets_section(contenders, base_med, idle, labels)
    out += ["", "Notes: " + " ".join(info["notes"])]
    return "\n".join(out) + "\n"


def versions() -> dict[str, str]:
    def first(argv: list[str], pick: Callable[[str], str]) -> str:
        try:
            return pick(run(argv).stdout)
        except Exception:
            return "?"

    return {
        "runc": first(["runc", "--version"], lambda s: s.split()[2]),
        "crun": first(["crun", "--version"], lambda s: s.split()[2]),
        "catatonit": first(["dpkg-query", "-W", "-f", "${Version}", "catatonit"], str.strip),
        "kernel": platform.release(),
        "os": first(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"], str.strip),
        "cpu": first(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], str.strip),
    }


async def amain(args: argparse.Namespace, janitor: Janitor, workdir: str, info: dict[str, Any],
                timings: dict[str, float]) -> str:
    from client.controller import Controller

    t_setup = time.perf_counter()
    cd = PrivateContainerd(os.path.join(workdir, "cd"), janitor)
    info["containerd"] = cd.start()
    image = os.path.join(workdir, "pause-image.tar")
    build_pause_image(image)
    cd.ctr("image", "import", "--index-name", IMAGE, image)
    crun, crun_note = crun_binary(workdir)
    info["notes"].append(f"crun: {crun_note}.")

    kinds = [("default", "podshim, default `Controller(state_root, runtime_root)`", True),
             ("exec", "podshim, `Controller(template=False)`: `podshim start` per shim", False)]
    hooks = startup_hooks()
    plain, bare = interpreter_start()
    info["notes"].append(
        f"Python start-up here: `python -c pass` {ms(plain)} ms, `python -I -S -c pass` {ms(bare)} ms (median of 5). "
        f"-S skips site-packages' start-up hooks ({', '.join(hooks) or 'none'}), which every Python process of this "
        "interpreter runs otherwise; podshim's exec path (`podshim start`, the template's start) runs without them.")
    timings["setup"] += time.perf_counter() - t_setup

    async with contextlib.AsyncExitStack() as stack:
        contenders: list[Contender] = [
            Containerd(cd, "runc", "containerd + runc", None, os.path.join(workdir, "runc-root"), True)]
        for key, label, template in kinds:
            t_kind = time.perf_counter()
            state_root, runtime_root = (os.path.join(workdir, f"ps-{key}", d) for d in ("state", "run"))
            janitor.add(f"podshim delete leftovers ({key})", delete_leftover_sandboxes, state_root, runtime_root)
            janitor.add(f"stop the shim template ({key})", stop_template, runtime_root)
            controller = await stack.enter_async_context(
                Controller(state_root, runtime_root, spawner=timed_spawner(runtime_root, template)))
            contenders.append(Podshim(key, label, controller, template))
            timings["setup"] += time.perf_counter() - t_kind
        floor_cgroups = [FloorCgroup(), FloorCgroupLockFree()]
        for floor_cgroup in floor_cgroups:
            janitor.add(f"remove the parent cgroup of “{floor_cgroup.label}”", floor_cgroup.release)
        contenders += [Floor(), *floor_cgroups]
        if crun:
            contenders.insert(1, Containerd(cd, "crun", "containerd + crun", crun, os.path.join(workdir, "crun-root"),
                                            False))
        else:
            info["notes"].append("containerd + crun: skipped, crun is not installed.")
        log(f"measuring: {args.cycles} rounds of {len(contenders)} contenders")
        info["load_before"] = os.getloadavg()[0]
        timings["lifecycle"], shares = await measure(contenders, args.cycles, args.warmup)
        info.update(shares)
        info["load_after"] = os.getloadavg()[0]

        idle: dict[int, dict[str, Idle]] = {}
        t_mem = time.perf_counter()
        for count in ([] if args.no_memory else args.sandboxes):
            log(f"idle memory: {count} sandbox(es) of each kind")
            idle[count] = {}
            for c in contenders:
                if c.measures_memory and c.error is None:
                    idle[count][c.key] = await c.idle(count)
        timings["memory"] = time.perf_counter() - t_mem

    for c in contenders:
        if isinstance(c, Containerd) and c.early:
            info["notes"].append(
                f"{c.label}: in {c.early} of {args.warmup + len(c.samples)} cycles the pause did not handle SIGTERM "
                "yet when `ctr run -d` returned (a TERM sent then is lost and costs the SIGKILL grace); the bench "
                "waited for it outside the timed phases.")
    pods = [c for c in contenders if isinstance(c, Podshim)]
    for c in pods:
        if c.template and c.first is not None:
            info["notes"].append(f"{c.label}: its first cycle, on a runtime root where no template ran yet (the "
                                 f"Controller starts one, then forks the shim from it), took {ms(c.first)} ms to "
                                 "the pause running (a warm-up cycle, not among the samples).")
    binaries = sorted({c.pause_binary for c in pods if c.pause_binary})
    info["notes"].append(f"Pause: containerd runs the image's /pause (catatonit {info['catatonit']}, static) on an "
                         f"overlayfs rootfs; podshim runs {', '.join(binaries) or '?'} from the host filesystem "
                         "(the native backend has no image rootfs).")
    leaked = sorted(p for c in pods for p in c.netns_seen if os.path.exists(p))
    info["notes"].append(f"Network namespaces made by podshim: {sum(len(c.netns_seen) for c in pods)}, "
                         f"left behind: {len(leaked)}{' ' + str(leaked) if leaked else ''}.")
    return report(info, contenders, idle)


def file_cost(directory: str, count: int = 60) -> float:
    """Median µs to make, write (300 bytes) and close a new file in ``directory`` (each removed)."""
    work = tempfile.mkdtemp(prefix=".filecost-", dir=directory)
    try:
        times = []
        for i in range(count):
            path = os.path.join(work, str(i))
            t0 = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.write(fd, b"x" * 300)
            os.close(fd)
            times.append((time.perf_counter() - t0) * 1e6)
            os.unlink(path)
        return statistics.median(times)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def file_cost_note(workdir: str) -> str:
    """The report's note on where the runtimes' files were made, and what a file costs there."""
    parent = os.path.dirname(workdir)
    here = file_cost(workdir)  # inside it: where the runtimes make theirs, and what the janitor removes
    tmp = file_cost(tempfile.gettempdir()) if os.path.realpath(parent) != os.path.realpath(tempfile.gettempdir()) else here
    return (f"Both runtimes' state (bundles, roots, sockets but containerd's /run/containerd/s) was under {workdir}; "
            f"a new file cost {here:.0f} µs there and {tmp:.0f} µs in {tempfile.gettempdir()} (median of 60).")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=30, help="interleaved rounds: cycles of each contender (30)")
    p.add_argument("--warmup", type=int, default=2, help="untimed cycles of each contender first (2)")
    p.add_argument("--sandboxes", default="1,20", help="idle sandboxes of each kind at once, comma-separated (1,20)")
    p.add_argument("--no-memory", action="store_true", help="skip the idle memory measurement")
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results"), help="where the report is written")
    p.add_argument("--workdir-parent", default="/var/lib",
                   help="where the run's temporary directory (both runtimes' state) is made (/var/lib)")
    args = p.parse_args(argv)
    args.sandboxes = [int(n) for n in args.sandboxes.split(",") if n.strip()]
    if args.cycles < 1 or args.warmup < 0 or any(n < 1 for n in args.sandboxes):
        p.error("--cycles and --sandboxes must be positive, --warmup not negative")
    if not os.path.isdir(args.workdir_parent):
        p.error(f"--workdir-parent {args.workdir_parent!r} is not a directory")
    return args


#: Set in the process that does the run: the one started from the command line only watches it.
SUPERVISED = "PODSHIM_BENCH_SUPERVISED"


def supervise(argv: list[str]) -> int:
    """Run this script again as a child and wait for it; return its exit status.

    The child does the run and cleans up after itself on SIGINT, SIGTERM or SIGHUP (Janitor).
    Killing the process started from the command line, even with SIGKILL, sends the child
    SIGTERM (PR_SET_PDEATHSIG), so that nothing is left behind: containerd, shims, namespaces,
    mounts, cgroups and the work directory. Ctrl-C reaches both; this one only waits.
    """
    from shim.kernel import linux

    parent = os.getpid()

    def die_with_parent() -> None:
        linux.set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent:  # gone before the request took: nobody would send it
            os.kill(os.getpid(), signal.SIGTERM)

    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], env={**os.environ, SUPERVISED: "1"},
                             preexec_fn=die_with_parent)
    forward = {sig: signal.signal(sig, lambda signum, frame: child.send_signal(signum))
               for sig in (signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends it to the child too
    try:
        status = child.wait()
        return 128 - status if status < 0 else status  # killed by a signal: as a shell says it
    finally:
        for sig, handler in forward.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not_root("it starts containerd, runc and shims that make namespaces and cgroups"):
        return 2
    if os.environ.get(SUPERVISED) != "1":
        return supervise(argv)
    t_start = time.perf_counter()
    janitor = Janitor()
    janitor.install()
    timings = {"setup": 0.0}
    try:
        packages = ensure_packages()
        compile_bytecode(REPO)
        workdir = tempfile.mkdtemp(prefix="podshim-cmp-", dir=args.workdir_parent)
        janitor.add("remove the work directory", shutil.rmtree, workdir, True)
        janitor.add("unmount what is left under the work directory", unmount_under, workdir)
        # Last line of defence, run after every orderly step: anything still naming our directory.
        janitor.add("kill leftover processes", kill_leftovers, workdir)
        timings["setup"] = time.perf_counter() - t_start
        now = datetime.datetime.now(datetime.UTC)
        info = {"date": now.strftime("%Y-%m-%d %H:%M UTC"), "nproc": os.cpu_count(), "cycles": args.cycles,
                "warmup": args.warmup, "notes": [file_cost_note(workdir)], **versions()}
        from shim.rpc.channel import install_uvloop

        install_uvloop()
        text = asyncio.run(amain(args, janitor, workdir, info, timings))
    finally:
        t_down = time.perf_counter()
        janitor.run()
        timings["teardown"] = time.perf_counter() - t_down
    total = time.perf_counter() - t_start
    text += (f"\nRun time: {total:.0f} s (setup {timings['setup']:.1f} s, packages: {packages}; lifecycle rounds "
             f"{timings['lifecycle']:.1f} s; idle memory {timings['memory']:.1f} s; teardown "
             f"{timings['teardown']:.1f} s).\n")
    if janitor.failures:
        text += "\nCleanup problems: " + "; ".join(janitor.failures) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"compare-{now.strftime('%Y%m%d-%H%M%S')}.md")
    with open(path, "w") as f:
        f.write(text)
    log(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
