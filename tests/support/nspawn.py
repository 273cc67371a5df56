"""A real systemd for tests: systemd booted as PID 1 of a systemd-nspawn container made of the
host's own /usr and /etc (nothing to download), with a private network.

    with project_venv(REPO) as venv, Machine.booted(binds_ro=[venv]) as m:
        m.install_units(REPO + "/systemd")
        m.systemctl("start", "podshim@ns1:sb1.service")
        m.run("ip", "netns", "list")
        m.host_path("/run/podshim/u/ns1:sb1.sock")   # a file of the container, seen from here

How: ``systemd-nspawn -D / --volatile=yes --bind-ro=/etc`` (a tmpfs root with the host's /usr
read-only: no first-boot, no preset), ``systemd.unit=basic.target`` (the host's enabled services
stay off), ``--register=no --keep-unit`` (the host runs no systemd to register with), in a cgroup
of its own, ``podshim-nspawn-<hex>``, under this process's cgroup in the ``unified`` and
``name=systemd`` hierarchies (without one, nspawn leaves ``payload``/``supervisor`` at their
roots). ``--notify-ready`` tells us when the container's systemd finished booting, and the
container's PID 1 as seen from here (X_NSPAWN_LEADER_PID); commands run in it through
``nsenter -t LEADER -a``. Boot takes about half a second, poweroff a fraction of one.

Everything is undone on exit, also when the boot fails: nspawn gets SIGTERM by pid (an orderly
poweroff), then SIGKILL; whatever still runs in the cgroup is killed with cgroup.kill; the cgroup
tree is removed bottom-up; the /run/systemd/nspawn* directories nspawn makes are removed when
they were not there before and are empty.

Python in the container: it sees only the host's /usr and /etc and what is bound in, so a
pyenv venv does not resolve there. :func:`project_venv` builds one from /usr/bin/python3.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

__all__ = ["BOOT_TIMEOUT", "CONTAINER_PATH", "Machine", "command_links", "nspawn_unavailable", "project_venv"]

#: From starting nspawn to READY=1 from the container's systemd (about 0.5 s when idle).
BOOT_TIMEOUT = 30.0
#: From SIGTERM to nspawn's exit (an orderly poweroff, about 0.1-2 s).
POWEROFF_TIMEOUT = 20.0
#: Removing the cgroup tree once its processes were killed (they take a moment to go).
CGROUP_REMOVE_TIMEOUT = 5.0
#: A venv: pip builds the project in an isolated environment and installs its dependencies.
VENV_TIMEOUT = 300.0
#: PATH for commands run in the container (this process's PATH names pyenv shims).
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Where .ci/install-units puts the units on a node (the host's, when the suite's own install ran here).
HOST_UNIT_DIR = "/usr/local/lib/systemd/system"
_SYSTEM_PYTHON = "/usr/bin/python3"
_SYSTEMD = "/lib/systemd/systemd"
_NSPAWN_DIRS = ("/run/systemd/nspawn/propagate", "/run/systemd/nspawn", "/run/systemd/nspawn-root")
_PROJECT_FILES = ("pyproject.toml", "README.md", "bin", "shim", "client")


def nspawn_unavailable() -> str | None:
    """Why systemd-nspawn cannot run here, or None. Installs systemd-container (apt-get) when
    only the package is missing; a failed install is an error (AssertionError), not a reason."""
    if os.geteuid() != 0:
        return "systemd-nspawn needs root"
    if not os.path.exists(_SYSTEMD) or not os.path.exists(_SYSTEM_PYTHON):
        return f"the host has no {_SYSTEMD} or {_SYSTEM_PYTHON} to boot a container from"
    if not os.path.isdir("/sys/fs/cgroup/unified") and not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return "no cgroup2 hierarchy to run a container in"
    if shutil.which("systemd-nspawn") is None:
        install = ["install", "-y", "-q", "--no-install-recommends", "systemd-container"]
        done = _apt_get(*install)
        if done.returncode != 0:  # package lists too old on a fresh machine
            _apt_get("update", "-q")
            done = _apt_get(*install)
        assert done.returncode == 0, f"apt-get install systemd-container failed: {done.stdout[-2000:]}{done.stderr}"
    return None


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=VENV_TIMEOUT)


@contextlib.contextmanager
def project_venv(project: str) -> Iterator[str]:
    """A venv of /usr/bin/python3 at a fresh /tmp path with the project pip-installed from a copy
    of its sources (not editable, so nothing is written into the checkout); removed on exit."""
    base = tempfile.mkdtemp(prefix="psh-venv-")
    try:
        source, venv = os.path.join(base, "src"), os.path.join(base, "venv")
        os.mkdir(source)
        for name in _PROJECT_FILES:
            src = os.path.join(project, name)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(source, name), ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(src, source)
        _run_checked([_SYSTEM_PYTHON, "-m", "venv", "--without-pip", venv])
        # This interpreter's pip installs into the venv (pip --python): no ensurepip needed.
        _run_checked([sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"), "install",
                      "--quiet", "--disable-pip-version-check", "--no-warn-script-location", source])
        os.chmod(base, 0o755)
        yield venv
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def command_links(venv: str) -> Iterator[str]:
    """A directory of links to the venv's podshim* commands, as .ci/install makes in /usr/local/bin."""
    links = tempfile.mkdtemp(prefix="psh-bin-")
    try:
        os.chmod(links, 0o755)
        for name in os.listdir(os.path.join(venv, "bin")):
            if name.startswith("podshim"):
                os.symlink(os.path.join(venv, "bin", name), os.path.join(links, name))
        yield links
    finally:
        shutil.rmtree(links, ignore_errors=True)


def _run_checked(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=VENV_TIMEOUT)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-3000:]}"


class Machine:
    """A booted container: ``leader`` is its PID 1 as seen from the host."""

    #: The project's venv bound into it and the directory of its command links, when a test put them there.
    venv: str = ""
    links: str = ""

    def __init__(self, name: str, process: subprocess.Popen[bytes], leader: int, console: str):
        self.name = name
        self.process = process
        self.leader = leader
        self.console = console

    @classmethod
    @contextlib.contextmanager
    def booted(cls, *, binds_ro: tuple[str, ...] | list[str] = (),
               binds: tuple[str, ...] | list[str] = ()) -> Iterator[Machine]:
        """Boot a container (``binds_ro`` bound read-only, ``binds`` writable, each ``HOST[:CONTAINER]``);
        power it off and remove every trace of it on exit."""
        tag = secrets.token_hex(5)
        name = f"psh-{tag}"
        cgroups = [os.path.join(mount, own.lstrip("/"), f"podshim-nspawn-{tag}") for mount, own in _own_cgroups()]
        created = [d for d in _NSPAWN_DIRS if not os.path.exists(d)]
        work = tempfile.mkdtemp(prefix="psh-nspawn-")
        console = os.path.join(work, "console.log")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        process = None
        try:
            for directory in cgroups:
                os.mkdir(directory)
            notify.bind(os.path.join(work, "notify"))
            argv = ["systemd-nspawn", "-D", "/", "-M", name, "--boot", "--register=no", "--keep-unit",
                    "--private-network", "--console=read-only", "--volatile=yes", "--bind-ro=/etc",
                    "--notify-ready=yes",
                    # The host's /usr is the node's: units .ci/install put in the host's /usr/local are hidden,
                    # so a node has the units its test installs and no others.
                    f"--tmpfs={HOST_UNIT_DIR}", *(f"--bind-ro={path}" for path in binds_ro),
                    *(f"--bind={path}" for path in binds), "--", "systemd.unit=basic.target"]
            # nspawn must start in its own cgroups: the shell joins them, then becomes nspawn.
            join = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1"; shift; n=$((n - 1)); done; exec "$@"'
            procs = [os.path.join(d, "cgroup.procs") for d in cgroups]
            with open(console, "wb") as log:
                process = subprocess.Popen(
                    ["sh", "-c", join, "sh", str(len(procs)), *procs, *argv],
                    env={**os.environ, "NOTIFY_SOCKET": notify.getsockname()}, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            leader = _wait_ready(notify, process, console)
            yield cls(name, process, leader, console)
        finally:
            notify.close()
            if process is not None:
                _power_off(process)
            _remove_cgroups(cgroups)
            for directory in created:
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
            shutil.rmtree(work, ignore_errors=True)

    # -- driving it -------------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True, timeout: float = 60.0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command in all of the container's namespaces; stdout and stderr as text.
        ``check``: AssertionError (with stderr) unless it exits 0."""
        done = subprocess.run(["nsenter", "-t", str(self.leader), "-a", "--", *argv], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout,
                              env={"PATH": CONTAINER_PATH, "LANG": "C.UTF-8", **(env or {})})
        if check:
            assert done.returncode == 0, f"{' '.join(argv)} in {self.name} exited {done.returncode}: {done.stderr}"
        return done

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", "--no-ask-password", *args, check=check)

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        """``systemctl show`` of some properties of a unit."""
        out = self.systemctl("show", "-p", ",".join(properties), unit).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def host_path(self, path: str) -> str:
        """A path of the container, as this process reaches it (through its PID 1's root)."""
        return f"/proc/{self.leader}/root{path}"

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write a file in the container (its /run and /var live in its own tmpfs)."""
        target = self.host_path(path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as f:
            f.write(text)
        os.chmod(target, mode)

    def install_units(self, directory: str) -> None:
        """Copy the unit files of ``directory`` to the container's /run/systemd/system and reload."""
        for name in sorted(os.listdir(directory)):
            if name.endswith((".service", ".socket")):
                with open(os.path.join(directory, name)) as f:
                    self.write_file(f"/run/systemd/system/{name}", f.read())
        self.systemctl("daemon-reload")

    def pid_alive(self, pid: int) -> bool:
        """Whether ``pid`` (a pid of the container) runs and is not a zombie."""
        try:
            with open(self.host_path(f"/proc/{pid}/stat"), "rb") as f:
                stat = f.read()
        except FileNotFoundError:
            return False
        return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] not in (b"Z", b"X")

    def mounts(self) -> str:
        """The mount table of the container's PID 1 (the container's own mount namespace)."""
        with open(f"/proc/{self.leader}/mountinfo") as f:
            return f.read()


def _own_cgroups() -> list[tuple[str, str]]:
    """``(mount point, this process's cgroup path)`` in the unified and name=systemd hierarchies."""
    found = []
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "" and os.path.isdir("/sys/fs/cgroup/unified"):
                found.append(("/sys/fs/cgroup/unified", path))
            elif controllers == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
                found.append(("/sys/fs/cgroup", path))
            elif controllers == "name=systemd":
                found.append(("/sys/fs/cgroup/systemd", path))
    return found


def _wait_ready(notify: socket.socket, process: subprocess.Popen[bytes], console: str) -> int:
    """Read nspawn's notifications until READY=1; the leader pid. AssertionError (with the
    console's end) when nspawn exits or BOOT_TIMEOUT passes first."""
    deadline = time.monotonic() + BOOT_TIMEOUT
    leader = None
    while True:
        # Short reads, so an nspawn that exits without notifying is seen at once.
        notify.settimeout(0.2)
        try:
            fields = dict(line.split("=", 1) for line in notify.recv(4096).decode().splitlines() if "=" in line)
        except TimeoutError:
            fields = {}
        leader = int(fields["X_NSPAWN_LEADER_PID"]) if "X_NSPAWN_LEADER_PID" in fields else leader
        if fields.get("READY") == "1" and leader is not None:
            return leader
        if process.poll() is not None or time.monotonic() > deadline:
            with open(console, errors="replace") as f:
                tail = f.read()[-3000:]
            raise AssertionError(f"the container did not boot (nspawn exit status {process.poll()}): {tail}")


def _power_off(process: subprocess.Popen[bytes]) -> None:
    process.terminate()  # nspawn turns SIGTERM into an orderly poweroff of the container
    try:
        process.wait(POWEROFF_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _remove_cgroups(cgroups: list[str]) -> None:
    for directory in cgroups:
        kill = os.path.join(directory, "cgroup.kill")
        if os.path.exists(kill):  # whatever outlived nspawn (cgroup v2 only)
            with contextlib.suppress(OSError):
                with open(kill, "w") as f:
                    f.write("1")
    deadline = time.monotonic() + CGROUP_REMOVE_TIMEOUT
    for directory in cgroups:
        for root, _, _ in os.walk(directory, topdown=False):
            while True:
                try:
                    os.rmdir(root)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    # EBUSY: killed members are still exiting; the kernel gives no event for it.
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
