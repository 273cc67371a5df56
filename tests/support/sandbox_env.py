"""Test support for the Controller and podshimctl suites: private roots and a leak check.

Each test gets its own state root and runtime root (short, so socket paths fit sun_path) and a
random tag for its sandbox ids. Sandbox cgroups are named after the sandbox id, so the tag also
finds this test's pause processes and cgroups. Teardown records what is left — shim processes
that mention the runtime root, sockets, bundles, tagged cgroups and pauses, new netns files —
then cleans it (``podshim delete`` per bundle, SIGKILL by pid) and fails the test if anything
was left.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from shim.launch.template import stop_template

from support.proctools import alive, unheld_netns

_T = TypeVar("_T")

PODSHIM = [sys.executable, "-m", "shim"]
PODSHIMCTL = [sys.executable, "-m", "client.cli"]
#: A bound for waiting on the machine in tests (processes to exit...), never a readiness sleep.
SETTLE = 5.0


@dataclass
class Env:
    state_root: str
    runtime_root: str
    tag: str
    netns_before: set[str] = field(default_factory=set)

    def sid(self, name: str) -> str:
        """A sandbox id unique to this test (cgroups are per id, and tests may run in parallel)."""
        return f"{self.tag}-{name}"

    def bundle(self, namespace: str, sandbox_id: str) -> str:
        return os.path.join(self.state_root, namespace, sandbox_id)

    def ctl(self, *argv: str, timeout: float = 30, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run podshimctl over this test's roots."""
        return subprocess.run([*PODSHIMCTL, "--root", self.state_root, "--runtime-root", self.runtime_root, *argv],
                              capture_output=True, text=True, timeout=timeout, input=input)

    def podshim(self, action: str, namespace: str, sandbox_id: str) -> subprocess.CompletedProcess[str]:
        bundle = self.bundle(namespace, sandbox_id)
        os.makedirs(bundle, mode=0o700, exist_ok=True)
        return subprocess.run([*PODSHIM, action, "--namespace", namespace, "--id", sandbox_id, "--bundle", bundle,
                               "--runtime-root", self.runtime_root], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ")
    except OSError:
        return b""


def shim_processes(runtime_root: str) -> list[int]:
    """Live processes whose command line names ``runtime_root``: shims and their helpers."""
    needle = runtime_root.encode()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()
            and needle in _cmdline(int(p)) and alive(int(p))]


def tagged_cgroups(tag: str) -> list[str]:
    return sorted(glob.glob(f"/sys/fs/cgroup/*/podshim/{tag}-*") + glob.glob(f"/sys/fs/cgroup/*/*/*/podshim/{tag}-*"))


def tagged_processes(tag: str) -> list[int]:
    """Processes in a cgroup of this test's sandboxes (pauses)."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cgroup") as f:
                if f"/podshim/{tag}-" in f.read() and alive(int(p)):
                    found.append(int(p))
        except OSError:
            continue
    return found


def netns_files() -> set[str]:
    """The sandbox netns files nobody is in (see :func:`tests.proctools.unheld_netns`)."""
    return unheld_netns("podshim-", exclude="podshim-test")


def bundles(state_root: str) -> list[str]:
    return sorted(glob.glob(os.path.join(state_root, "*", "*")) + glob.glob(os.path.join(state_root, "*", ".*")))


def leftovers(env: Env) -> dict[str, list[Any]]:
    sockets = os.path.join(env.runtime_root, "s")
    found: dict[str, list[Any]] = {
        "shim processes": shim_processes(env.runtime_root),
        "pause processes": tagged_processes(env.tag),
        "sockets": sorted(os.listdir(sockets)) if os.path.isdir(sockets) else [],
        "bundles": bundles(env.state_root),
        "cgroups": tagged_cgroups(env.tag),
    }
    return {k: v for k, v in found.items() if v}


def settle(check: Callable[[], _T], timeout: float = SETTLE) -> _T:
    """Poll ``check()`` until it returns something falsy or ``timeout`` passes; the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if not value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def settle_persistent(check: Callable[[], set[_T]], timeout: float = SETTLE) -> set[_T]:
    """What every ``check()`` (a set) held, polled until that is empty or ``timeout`` passes: what
    was there all along. A netns that comes and goes meanwhile is another test run's pod."""
    deadline = time.monotonic() + timeout
    held = set(check())
    while held and time.monotonic() < deadline:
        time.sleep(0.02)
        held &= set(check())
    return held


def clean(env: Env) -> None:
    """Remove whatever a test left: `podshim delete` every bundle, then SIGKILL by pid."""
    for path in bundles(env.state_root):
        namespace, name = path.split(os.sep)[-2:]
        if not name.startswith("."):
            env.podshim("delete", namespace, name)
    for pid in shim_processes(env.runtime_root) + tagged_processes(env.tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for path in tagged_cgroups(env.tag):
        try:
            os.rmdir(path)
        except OSError:
            pass


@pytest.fixture
def env() -> Iterator[Env]:
    """Private roots for one test, and the leak check after it."""
    state_root = tempfile.mkdtemp(prefix="podshim-state-")
    runtime_root = tempfile.mkdtemp(prefix="ps-rt-")  # short: <root>/s/<32 hex> must fit sun_path
    e = Env(state_root, runtime_root, f"t{secrets.token_hex(3)}", netns_files())
    try:
        yield e
    finally:
        stop_template(runtime_root)  # the Controller's default template of this root, if one started
        left = settle(lambda: leftovers(e))
        clean(e)
        new_netns = settle_persistent(lambda: netns_files() - e.netns_before)
        shutil.rmtree(state_root, ignore_errors=True)
        shutil.rmtree(runtime_root, ignore_errors=True)
        assert not left, f"the test left these behind: {left}"
        assert not new_netns, f"netns files appeared during the test and are still there: {sorted(new_netns)}"
