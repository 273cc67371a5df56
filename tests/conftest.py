"""Suite-wide guard: whatever the tests make, the suite leaves nothing behind.

A session fixture records podshim's footprint on the machine before the first test and fails
the run if, after the last test, there are more podshim processes, pause processes, netns
files or netns mounts than before. Individual tests clean up after themselves; this catches
the one that forgot.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

#: Every process this session starts inherits this marker, so the guard below counts only
#: processes of this run, not those of another run sharing the machine. (The pause drops its
#: environment at exec; a leaked pause still shows up through the netns it pins.)
SESSION_MARKER = f"PODSHIM_TEST_SESSION={secrets.token_hex(8)}"
os.environ["PODSHIM_TEST_SESSION"] = SESSION_MARKER.split("=", 1)[1]

from shim.kernel.reaper import Reaper  # noqa: E402  (imported once the marker is in the environment)

# The local registry and the test images, one of each per session, started on first use (see
# tests/support/registry.py and tests/support/imagebuild.py). Fixtures are found by name in a conftest module.
from support.imagebuild import test_images  # noqa: E402  (after the marker, as above)
from support.proctools import unheld_netns  # noqa: E402  (after the marker, as above)
from support.registry import auth_registry, registry  # noqa: E402  (after the marker, as above)
from support.sandbox_env import settle_persistent  # noqa: E402  (after the marker, as above)
from support.shimtools import SessionTemplate, reap_adopted_zombies  # noqa: E402  (after the marker, as above)

__all__ = ["auth_registry", "registry", "test_images"]


def pytest_sessionstart(session: pytest.Session) -> None:
    """The checkout under test has the code .ci/install generates from the pinned schemas (a
    worktree made after the install has none): compiled now if missing, by this Python's grpcio-tools."""
    from support.critools import gotool

    gotool.compile_schemas(sys.executable)


def _pure_cgroup_v2() -> bool:
    from shim.kernel.cgroups import hierarchies

    return hierarchies.pure_v2(hierarchies.discover_hierarchies())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ``cgroupv2`` test is skipped where the host is not pure cgroup v2 (it runs in the guest)."""
    if _pure_cgroup_v2():
        return
    skip = pytest.mark.skip(reason="needs pure cgroup v2: `pytest -m cgroupv2 tests` runs it in the guest")
    for item in items:
        if item.get_closest_marker("cgroupv2") is not None:
            item.add_marker(skip)


def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """``-m cgroupv2`` on a host that is not pure cgroup v2: the same pytest command runs in the
    guest (tests/support/guest.py: built once, booted or reused, the checkout synced into it), its output
    shown here and its outcome this session's."""
    markexpr = session.config.getoption("markexpr") or ""
    if "cgroupv2" not in markexpr or os.environ.get("PODSHIM_IN_GUEST") == "1" or _pure_cgroup_v2():
        return None
    from support import guest
    root = str(session.config.rootpath)
    args = [os.path.relpath(os.path.abspath(arg), root) if os.path.exists(arg) else arg
            for arg in session.config.invocation_params.args]
    with guest.booted(reuse=os.environ.get("PODSHIM_GUEST_REUSE") == "1") as vm:
        result = vm.pytest(args)
    sys.stdout.write(result.stdout.decode(errors="replace"))
    sys.stderr.write(result.stderr.decode(errors="replace"))
    if result.returncode not in (0, 5):  # 5: no test selected
        session.testsfailed = 1
    return True


@pytest.fixture
async def reaper():
    """The shim's one Reaper, installed on the test's event loop (the process is a subreaper meanwhile)."""
    reaper = Reaper()
    reaper.install()
    yield reaper
    reaper.uninstall()


@pytest.fixture(autouse=True)
def adopted_zombies_reaped():
    """After each test, reap the template processes this process adopted while it was a child
    subreaper (a Reaper, adopting_orphans) and that exited since: nobody else would, and a run
    would collect them by the thousand. A Popen's child is never reaped here."""
    yield
    reap_adopted_zombies()


@pytest.fixture
def sleeper():
    """A live process nobody else knows (``sleep 600``), killed and reaped after the test."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _podshim_processes() -> set[int]:
    """Live (non-zombie) shim and pause processes started by this test session."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] in (b"Z", b"X"):
            continue
        joined = b" ".join(argv)
        if (b"podshim" in joined and b"pytest" not in joined) or b"-m shim" in joined:
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if SESSION_MARKER.encode() not in f.read().split(b"\0"):
                        continue
            except OSError:
                continue
            found.add(int(entry))
    return found


def _netns_mounts(files: set[str]) -> set[str]:
    """The mounts of ``files`` (netns files) that are still mounted."""
    with open("/proc/self/mountinfo") as f:
        mounted = {line.split()[4] for line in f}
    return {p for p in (f"/run/netns/{n}" for n in files) if p in mounted}


def footprint() -> dict[str, set]:
    # Not the namespaces of another test run's pods (a run beside this one).
    files = unheld_netns()
    return {"processes": _podshim_processes(), "netns files": files, "netns mounts": _netns_mounts(files)}


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind():
    before = footprint()
    yield
    # Processes reparented to a PID 1 that reaps slowly may take a moment to disappear. What was
    # there all along counts: a netns that comes and goes meanwhile is another run's pod.
    leaked = settle_persistent(lambda: {(k, v) for k, now in footprint().items() for v in now - before[k]}, 5)
    left: dict[str, list] = {}
    for kind, item in sorted(leaked):
        left.setdefault(kind, []).append(item)
    assert not left, f"the test suite left these behind: {left}"


# -- both ways: exec spawning and template spawning -----------------------------------------------
@pytest.fixture(scope="session")
def session_template():
    template = SessionTemplate()
    yield template
    template.stop()


@pytest.fixture(params=["exec", "template"])
def spawn_mode(request, session_template, monkeypatch):
    """Run a test once with shims exec'd (`podshim start`) and once forked by a template.

    Modules opt in with ``pytestmark = pytest.mark.usefixtures("spawn_mode")``; subprocesses
    (controllers, podshimctl, `podshim start`) inherit the choice: "exec" sets $PODSHIM_TEMPLATE=0,
    so no Controller starts or uses a template; "template" names the session's template in
    $PODSHIM_TEMPLATE_SOCKET. (Tests that use neither get the default: the runtime root's own
    template, started on first use; their fixtures stop it, see sandbox_env.stop_template.)
    """
    from shim.api.names import TEMPLATE_ENV, TEMPLATE_SOCKET_ENV

    if request.param == "template":
        monkeypatch.setenv(TEMPLATE_SOCKET_ENV, session_template.socket())
        monkeypatch.delenv(TEMPLATE_ENV, raising=False)
    else:
        monkeypatch.delenv(TEMPLATE_SOCKET_ENV, raising=False)
        monkeypatch.setenv(TEMPLATE_ENV, "0")
    return request.param
