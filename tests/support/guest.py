"""A Debian 12 guest on pure cgroup v2 under qemu (software emulation), to test what this machine's
own hierarchies (v1 controllers and an empty v2 one) cannot show.

The image is made once, from Debian's packages only, into a cache outside the repository
($PODSHIM_GUEST_CACHE, default /var/cache/podshim-guest), under a key hashed from the recipe (this
file's recipe, .ci/install, .ci/pins.toml, pyproject.toml's project table): debootstrap of bookworm with Debian's cloud
kernel, its initramfs and systemd (which boots the unified hierarchy alone), then podshim
installed in a chroot by the README's command (``.ci/install --test``) from a copy of the
checkout, Debian's dynamic busybox package unpacked where the tests look for it (critest's default
image), and the image written as an ext4 file system (``mkfs.ext4 -d``). A boot runs that image
with ``snapshot=on`` (what the guest writes goes to a temporary file qemu drops at exit), no network
device at all, and the kernel and initramfs given to qemu directly.

The host drives the guest over a virtio-serial port (a Unix socket on the host, /dev/virtio-ports/
podshim.agent in the guest) that a small agent started by systemd answers: one JSON line per
request (run a command, write a tar of files, power off), one per answer. Files go in by that
channel too (a tar of the checkout is unpacked over the copy the image was built from, so the
editable install runs the host's code): the guest writes nothing of the host's, and no 9p or
virtiofs support is asked of the guest kernel or qemu's emulation.

    python -m tests.support.guest build               make the image unless cached; print its directory
    python -m tests.support.guest run [--] CMD...     boot (or reuse a booted guest), sync the checkout, run
    python -m tests.support.guest stop                power a booted guest off
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("PODSHIM_GUEST_CACHE") or "/var/cache/podshim-guest"
#: Where a booted guest keeps its qemu pid, sockets and console log (one guest per image key).
RUN_DIR = os.environ.get("PODSHIM_GUEST_RUN") or "/run/podshim-guest"
MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
#: Where the checkout's copy lives in the guest (the editable install's source) and its venv.
GUEST_SRC = "/opt/podshim-src"
GUEST_VENV = "/opt/podshim"
#: Debian packages debootstrap puts in besides its minbase set; .ci/install adds podshim's own.
PACKAGES = ("systemd", "systemd-sysv", "udev", "dbus", "linux-image-cloud-amd64", "initramfs-tools",
            "python3", "python3-venv", "ca-certificates", "procps", "kmod", "e2fsprogs")
IMAGE_SIZE = "8G"  # sparse
#: How much slower the tests' waits may be in the guest: everything runs emulated.
SLOWDOWN = "10"
MEMORY = "3G"
CPUS = 2
BOOT_TIMEOUT = float(os.environ.get("PODSHIM_GUEST_BOOT_TIMEOUT", 300))
BUILD_TIMEOUT = 60 * 60
#: Seconds a pytest run in the guest may take by default: room for the whole ``cgroupv2`` selection,
#: emulated (its time: docs/testing.md).
PYTEST_TIMEOUT = 3 * 60 * 60
#: Host tools (built by .ci/gotool) copied into the guest's tools cache, so the guest needs no Go.
TOOLS_CACHE = os.environ.get("PODSHIM_TOOLS_CACHE") or "/var/cache/podshim-tools"
TOOLS = ("crictl-v1.37.0", "critest-v1.37.0")
GUEST_TOOLS_CACHE = "/var/cache/podshim-tools"

AGENT = r'''#!/usr/bin/python3
"""podshim's guest agent: one JSON request a line on the virtio port, one JSON answer a line."""
import base64, io, json, os, subprocess, tarfile, time
def answer(obj):
    data = memoryview(json.dumps(obj).encode() + b"\n")
    while data:
        data = data[os.write(fd, data):]
def requests():
    """The port's lines, host connection after host connection: with no host connected a read
    is EOF at once, so the agent waits for the next one rather than exiting (systemd would
    restart it until its start limit, and a reused guest would answer no more)."""
    global fd
    while True:
        fd = os.open("/dev/virtio-ports/podshim.agent", os.O_RDWR)
        with os.fdopen(fd, "rb") as reader:
            yield from reader
        time.sleep(0.2)
for line in requests():
    try:
        req = json.loads(line)
    except ValueError:
        continue
    rid, op = req.get("id"), req.get("op")
    try:
        if op == "ping":
            answer({"id": rid, "ok": True})
        elif op == "run":
            env = dict(os.environ, **req.get("env", {}))
            try:
                p = subprocess.run(req["argv"], cwd=req.get("cwd") or "/", env=env, capture_output=True,
                                   timeout=req.get("limit"), stdin=subprocess.DEVNULL)
                rc, out, err = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired as exc:
                rc, out, err = -9, exc.stdout or b"", (exc.stderr or b"") + b"\n(timed out)\n"
            answer({"id": rid, "rc": rc, "stdout": base64.b64encode(out).decode(),
                    "stderr": base64.b64encode(err).decode()})
        elif op == "untar":
            with tarfile.open(fileobj=io.BytesIO(base64.b64decode(req["data"]))) as tar:
                tar.extractall(req["path"])  # the host's checkout (bookworm's 3.11.2 has no filter=)
            answer({"id": rid, "ok": True})
        elif op == "poweroff":
            answer({"id": rid, "ok": True})
            subprocess.run(["systemctl", "--no-block", "poweroff"])
        else:
            answer({"id": rid, "error": "unknown op %r" % op})
    except Exception as exc:
        answer({"id": rid, "error": "%s: %s" % (type(exc).__name__, exc)})
'''

AGENT_UNIT = """[Unit]
Description=podshim guest agent
After=dev-virtio\\x2dports-podshim.agent.device
Requires=dev-virtio\\x2dports-podshim.agent.device

[Service]
ExecStart=/usr/local/sbin/podshim-guest-agent
Restart=always

[Install]
WantedBy=multi-user.target
"""


class GuestError(Exception):
    """The guest could not be built, booted or asked."""


#: Raised by hand when how the image is made (_configure, _install_podshim) changes.
RECIPE_VERSION = 2


def recipe_key() -> str:
    """The hash of everything the image is made from: a change to any of it makes a new image."""
    digest = hashlib.sha256(repr((RECIPE_VERSION, SUITE, MIRROR, PACKAGES, IMAGE_SIZE, TOOLS, AGENT,
                                  AGENT_UNIT)).encode())
    for path in (".ci/install", ".ci/pins.toml"):
        with open(os.path.join(ROOT, path), "rb") as f:
            digest.update(path.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:  # what it installs, not how tests run
        digest.update(repr(sorted(tomllib.load(f)["project"].items())).encode())
    return digest.hexdigest()[:16]


def image_dir(key: str | None = None) -> str:
    return os.path.join(CACHE, key or recipe_key())


def checkout_files() -> list[str]:
    """The checkout's files as the host has them now: tracked and untracked, ignored ones left out."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p and os.path.isfile(os.path.join(ROOT, p))]


def checkout_tar() -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for path in checkout_files():
            tar.add(os.path.join(ROOT, path), arcname=path)
    return data.getvalue()


def _log(message: str) -> None:
    print(f"guest: {message}", file=sys.stderr, flush=True)


def build(key: str | None = None) -> str:
    """Make the image unless cached; its directory (vmlinuz, initrd.img, root.img)."""
    key = key or recipe_key()
    target = image_dir(key)
    if os.path.exists(os.path.join(target, "root.img")):
        return target
    os.makedirs(CACHE, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".build-{key}-", dir=CACHE)
    try:
        started = time.monotonic()
        rootfs = os.path.join(work, "rootfs")
        base = _debootstrapped()
        _check(["cp", "-a", base, rootfs])
        debootstrapped = time.monotonic()
        _configure(rootfs)
        _install_podshim(rootfs)
        installed = time.monotonic()
        os.makedirs(os.path.join(work, "image"))
        for name in ("vmlinuz", "initrd.img"):
            shutil.copyfile(os.path.realpath(os.path.join(rootfs, name)), os.path.join(work, "image", name))
        _log("mkfs.ext4 -d")
        _check(["mkfs.ext4", "-q", "-F", "-L", "podshim-root", "-d", rootfs,
                os.path.join(work, "image", "root.img"), IMAGE_SIZE])
        done = time.monotonic()
        with open(os.path.join(work, "image", "build-times.json"), "w") as f:
            json.dump({"debootstrap_s": round(debootstrapped - started, 1),
                       "install_s": round(installed - debootstrapped, 1),
                       "mkfs_s": round(done - installed, 1), "total_s": round(done - started, 1)}, f)
        try:
            os.rename(os.path.join(work, "image"), target)
        except OSError:
            if not os.path.exists(os.path.join(target, "root.img")):
                raise
            _log(f"{target} was built meanwhile by another run: that one is used")  # this one goes
        else:
            _log(f"built {target} in {done - started:.0f} s")
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _debootstrapped() -> str:
    """Debian's base system with PACKAGES, made once and kept beside the images (keyed by what it
    is made of): a change to how podshim is installed reuses it."""
    key = hashlib.sha256(repr((SUITE, MIRROR, PACKAGES)).encode()).hexdigest()[:16]
    target = os.path.join(CACHE, f"base-{key}")
    if os.path.isdir(target):
        return target
    work = tempfile.mkdtemp(prefix=f".base-{key}-", dir=CACHE)
    try:
        _log(f"debootstrap {SUITE}")
        _check(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                os.path.join(work, "rootfs"), MIRROR])
        os.rename(os.path.join(work, "rootfs"), target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _check(argv: Sequence[str], **kwargs: Any) -> None:
    result = subprocess.run(argv, timeout=BUILD_TIMEOUT, **kwargs)
    if result.returncode != 0:
        raise GuestError(f"{' '.join(argv[:3])}... failed with exit status {result.returncode}")


def _write(rootfs: str, path: str, text: str, mode: int = 0o644) -> None:
    full = os.path.join(rootfs, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text)
    os.chmod(full, mode)


def _configure(rootfs: str) -> None:
    _write(rootfs, "/etc/hostname", "podshim-guest\n")
    _write(rootfs, "/etc/hosts", "127.0.0.1 localhost podshim-guest\n")
    _write(rootfs, "/etc/fstab", "LABEL=podshim-root / ext4 rw,errors=remount-ro 0 1\n")
    _write(rootfs, "/usr/local/sbin/podshim-guest-agent", AGENT, 0o755)
    _write(rootfs, "/etc/systemd/system/podshim-guest-agent.service", AGENT_UNIT)
    os.symlink("/etc/systemd/system/podshim-guest-agent.service",
               os.path.join(rootfs, "etc/systemd/system/multi-user.target.wants/podshim-guest-agent.service"))
    # No login on the console: the agent is the way in.
    for unit in ("serial-getty@ttyS0.service", "getty@tty1.service"):
        os.symlink("/dev/null", os.path.join(rootfs, "etc/systemd/system", unit))
    with open(os.path.join(rootfs, "etc/apt/sources.list"), "w") as f:
        f.write(f"deb {MIRROR} {SUITE} main\n")


def _install_podshim(rootfs: str) -> None:
    """Copy the checkout into the guest's tree and run the README's install command there, in a
    chroot whose /proc, /sys and /dev are mounted in a mount namespace of its own (they go with it).
    Then what the tests fetch on first use and the offline guest cannot: Debian's dynamic busybox
    (critest's default image is made of it), unpacked into the guest's test-image cache by the
    tests' own code (support.imagebuild.dynamic_busybox)."""
    src = os.path.join(rootfs, GUEST_SRC.lstrip("/"))
    with tarfile.open(fileobj=io.BytesIO(checkout_tar())) as tar:
        tar.extractall(src, filter="tar")
    for tool in TOOLS:
        if os.path.isdir(os.path.join(TOOLS_CACHE, tool)):
            shutil.copytree(os.path.join(TOOLS_CACHE, tool), os.path.join(rootfs, GUEST_TOOLS_CACHE.lstrip("/"), tool))
    go = "/usr/local/go"  # the host's Go, lent for the schema compile (never left in the image)
    # The host's CA bundle (it may trust an egress proxy's CA) and its pip/TLS settings are lent
    # too, bound over the guest's bundle only while the install runs.
    bundle = "/etc/ssl/certs/ca-certificates.crt"
    passed = " ".join(f"{name}={value}" for name, value in sorted(os.environ.items())
                      if name.startswith(("PIP_", "GOPROXY", "GOSUMDB", "GONOSUMDB", "GOPRIVATE"))
                      or name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "http_proxy",
                                  "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"))
    script = f"""set -e
mount -t proc proc {rootfs}/proc
mount -t sysfs sysfs {rootfs}/sys
mount --rbind /dev {rootfs}/dev
cp /etc/resolv.conf {rootfs}/etc/resolv.conf
if [ -f {bundle} ]; then touch {rootfs}{bundle}; mount --bind -o ro {bundle} {rootfs}{bundle}; fi
if [ -d /opt/wheels ]; then mkdir -p {rootfs}/opt/wheels; mount --bind -o ro /opt/wheels {rootfs}/opt/wheels; fi
if [ -d {go} ]; then mkdir -p {rootfs}{go}; mount --bind -o ro {go} {rootfs}{go}; fi
chroot {rootfs} /usr/bin/env -i PATH={go}/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root {passed} \
    PODSHIM_TOOLS_CACHE=/var/cache/podshim-tools PODSHIM_GUEST_BUILD=1 sh -c 'cd {GUEST_SRC} && .ci/install --test'
chroot {rootfs} /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root {passed} sh -c \
    'cd {GUEST_SRC}/tests && {GUEST_VENV}/bin/python -c "from support.imagebuild import dynamic_busybox; dynamic_busybox()"'
rm -f {rootfs}/etc/resolv.conf
chroot {rootfs} apt-get clean
"""
    _log("chroot: .ci/install --test")
    _check(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    for lent in (go, "/opt/wheels"):
        shutil.rmtree(os.path.join(rootfs, lent.lstrip("/")), ignore_errors=True)


class Guest:
    """A booted guest: its qemu process and the agent's channel."""

    def __init__(self, directory: str, pid: int, sock: socket.socket) -> None:
        self.directory = directory
        self.pid = pid
        self.sock = sock
        self.reader = sock.makefile("rb")
        self._next = 0

    def close(self) -> None:
        """Let go of the agent's channel; the guest runs on."""
        self.reader.close()
        self.sock.close()

    def request(self, op: str, timeout: float | None = None, **fields: Any) -> dict[str, Any]:
        self._next += 1
        rid = f"{os.getpid()}-{time.monotonic_ns()}-{self._next}"
        self.sock.settimeout(timeout)
        self.sock.sendall(json.dumps({"id": rid, "op": op, **fields}).encode() + b"\n")
        while True:
            line = self.reader.readline()
            if not line:
                raise GuestError("the guest agent closed its channel")
            answer: dict[str, Any] = json.loads(line)
            if answer.get("id") == rid:
                if "error" in answer:
                    raise GuestError(f"guest agent: {answer['error']}")
                return answer

    def run(self, argv: Sequence[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 1800) -> subprocess.CompletedProcess[bytes]:
        answer = self.request("run", timeout=timeout + 30, argv=list(argv), cwd=cwd, env=env or {},
                              limit=timeout)
        return subprocess.CompletedProcess(list(argv), answer["rc"], base64.b64decode(answer["stdout"]),
                                           base64.b64decode(answer["stderr"]))

    def pytest(self, args: Sequence[str], timeout: float = PYTEST_TIMEOUT) -> subprocess.CompletedProcess[bytes]:
        """Run the suite's pytest with ``args`` in the guest's checkout, its waits stretched for
        emulation (PODSHIM_TEST_SLOWDOWN)."""
        return self.run([f"{GUEST_VENV}/bin/python", "-m", "pytest", "-p", "no:cacheprovider", *args],
                        cwd=GUEST_SRC, env={"PODSHIM_IN_GUEST": "1", "PODSHIM_TEST_SLOWDOWN": SLOWDOWN},
                        timeout=timeout)

    def put_tar(self, data: bytes, path: str) -> None:
        self.request("untar", timeout=300, data=base64.b64encode(data).decode(), path=path)

    def sync_checkout(self) -> None:
        """Unpack the host checkout over the guest's copy (the editable install runs it)."""
        self.put_tar(checkout_tar(), GUEST_SRC)

    def sync_tools(self) -> None:
        """Copy in the host's tools (:data:`TOOLS`) the image lacks: those built on the host after
        the image was (their presence is not part of its key)."""
        present = [tool for tool in TOOLS if os.path.isdir(os.path.join(TOOLS_CACHE, tool))]
        if not present:
            return
        listed = self.run(["ls", GUEST_TOOLS_CACHE], timeout=60).stdout.decode().split()
        missing = [tool for tool in present if tool not in listed]
        if missing:
            data = io.BytesIO()
            with tarfile.open(fileobj=data, mode="w:gz") as tar:
                for tool in missing:
                    tar.add(os.path.join(TOOLS_CACHE, tool), arcname=tool)
            self.put_tar(data.getvalue(), GUEST_TOOLS_CACHE)
            _log(f"copied {', '.join(missing)} into the guest")


def _run_dir(key: str) -> str:
    return os.path.join(RUN_DIR, key)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _connect(path: str, deadline: float) -> Guest | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return Guest(os.path.dirname(path), 0, sock)


def boot(key: str | None = None) -> Guest:
    """The guest of the image ``key``: one already booted (left by ``--reuse``), or a new boot."""
    key = key or recipe_key()
    image = build(key)
    run = _run_dir(key)
    pidfile = os.path.join(run, "qemu.pid")
    agent = os.path.join(run, "agent.sock")
    if os.path.exists(pidfile):
        pid = _read_pid(pidfile)
        if pid and _alive(pid):
            guest = _connect(agent, time.monotonic() + 5)
            if guest is not None:
                guest.pid = pid
                try:
                    guest.request("ping", timeout=30)
                    return guest
                except (GuestError, OSError):
                    guest.close()
            _stop_pid(pid)
        shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run, exist_ok=True)
    started = time.monotonic()
    argv = ["qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max", "-m", MEMORY, "-smp", str(CPUS),
            "-display", "none", "-no-reboot", "-nic", "none",
            "-kernel", os.path.join(image, "vmlinuz"), "-initrd", os.path.join(image, "initrd.img"),
            "-append", "root=LABEL=podshim-root rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 quiet",
            "-drive", f"file={os.path.join(image, 'root.img')},format=raw,if=virtio,snapshot=on",
            "-serial", f"file:{os.path.join(run, 'console.log')}",
            "-chardev", f"socket,id=agent,path={agent},server=on,wait=off",
            "-device", "virtio-serial", "-device", "virtserialport,chardev=agent,name=podshim.agent",
            "-pidfile", pidfile, "-daemonize"]
    result = subprocess.run(argv, capture_output=True, timeout=60)
    if result.returncode != 0:
        shutil.rmtree(run, ignore_errors=True)
        raise GuestError(f"qemu failed: {result.stderr.decode().strip()}")
    pid = _read_pid(pidfile)
    deadline = started + BOOT_TIMEOUT
    try:
        guest = None
        while guest is None and time.monotonic() < deadline:
            guest = _connect(agent, deadline)
            if guest is None:
                time.sleep(0.2)
        if guest is None:
            raise GuestError("qemu's agent socket never appeared")
        guest.pid = pid
        # The agent answers once systemd has started it; a ping sent before is lost or queued.
        while True:
            if not _alive(pid):
                raise GuestError(f"qemu exited while booting; see {os.path.join(run, 'console.log')}")
            if time.monotonic() >= deadline:
                raise GuestError(f"the guest did not answer within {BOOT_TIMEOUT:.0f} s")
            try:
                guest.request("ping", timeout=2)
                break
            except TimeoutError:
                guest.reader.close()
                guest.reader = guest.sock.makefile("rb")
                continue
    except BaseException:
        _stop_pid(pid)
        shutil.rmtree(run, ignore_errors=True)
        raise
    _log(f"booted in {time.monotonic() - started:.1f} s")
    return guest


def _read_pid(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip() or 0)


def _stop_pid(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        os.kill(pid, 9)
        while _alive(pid):
            time.sleep(0.05)


def shutdown(guest: Guest, timeout: float = 60) -> None:
    """Power the guest off (killing qemu if it does not stop in time) and remove its run directory."""
    try:
        guest.request("poweroff", timeout=10)
    except (GuestError, OSError):
        pass
    guest.close()
    _stop_pid(guest.pid, timeout)
    shutil.rmtree(guest.directory, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(RUN_DIR)  # when no other guest runs


@contextlib.contextmanager
def booted(reuse: bool = False) -> Iterator[Guest]:
    """A booted guest with the checkout synced; powered off after unless ``reuse``."""
    guest = boot()
    try:
        guest.sync_checkout()
        guest.sync_tools()
        yield guest
    finally:
        if not reuse:
            shutdown(guest)
        else:
            guest.close()


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("build", "run", "stop", "key"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "key":
        print(recipe_key())
        return 0
    if argv[0] == "build":
        print(build())
        return 0
    if argv[0] == "stop":
        pidfile = os.path.join(_run_dir(recipe_key()), "qemu.pid")
        if os.path.exists(pidfile):
            shutdown(boot())
        return 0
    command = argv[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    reuse = os.environ.get("PODSHIM_GUEST_REUSE") == "1"
    with booted(reuse=reuse) as guest:
        result = guest.run(["sh", "-c", " ".join(command)] if command else ["true"], cwd=GUEST_SRC)
        sys.stdout.buffer.write(result.stdout)
        sys.stderr.buffer.write(result.stderr)
        return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
