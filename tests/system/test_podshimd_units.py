"""podshimd started the way podshimd.socket starts it (``systemd-socket-activate``
playing systemd): it serves crictl on the socket systemd made, through its relay, and leaves that
socket to systemd."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time

import pytest

from shim.launch.template import stop_template

from support.critools import podshimd_argv

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def directory():
    path = tempfile.mkdtemp(prefix="psd-sa-")
    os.mkdir(os.path.join(path, "run"), 0o700)
    yield path
    shutil.rmtree(path)


def activated(directory: str, *extra: str, socket_path: str | None = None) -> subprocess.Popen:
    """podshimd under systemd-socket-activate, which binds the socket and execs the daemon with it
    (LISTEN_FDS) on the first connection."""
    socket_path = socket_path or os.path.join(directory, "run", "podshimd.sock")
    open(os.path.join(directory, "config.toml"), "w").close()
    process = subprocess.Popen(["systemd-socket-activate", "-l", socket_path, *podshimd_argv(directory, *extra)],
                               cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    # As under systemd, the socket is there before any client comes: wait until it is bound.
    deadline = time.monotonic() + 30
    while not os.path.exists(socket_path):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            out, _ = process.communicate()
            pytest.fail(f"systemd-socket-activate did not bind {socket_path}: {out}")
        time.sleep(0.02)
    return process


def crictl_at(crictl: str, path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([crictl, "--runtime-endpoint", f"unix://{path}", "--image-endpoint", f"unix://{path}",
                           "--timeout", "30s", *args], capture_output=True, text=True, timeout=60)


def test_socket_activated_it_serves_on_systemds_socket_and_leaves_it_to_systemd(directory, crictl) -> None:
    path = os.path.join(directory, "run", "podshimd.sock")
    daemon = activated(directory)
    try:
        # The socket exists before the daemon runs; the first connection starts it and is served.
        version = crictl_at(crictl, path, "version")
        assert version.returncode == 0 and "RuntimeName:  podshim" in version.stdout, version.stderr
        pod = crictl_at(crictl, path, "runp", os.path.join(REPO, "examples", "pod-config.json"))
        assert pod.returncode == 0, pod.stderr
        listed = crictl_at(crictl, path, "pods", "-q")
        assert listed.stdout.split() == [pod.stdout.strip()]
        assert crictl_at(crictl, path, "rmp", "-f", pod.stdout.strip()).returncode == 0
        # Served on systemd's descriptor itself: no socket of its own beside it (the template's is the shims').
        run = os.path.join(directory, "run")
        assert sorted(name for name in os.listdir(run) if stat.S_ISSOCK(os.lstat(os.path.join(run, name)).st_mode)) == \
            ["podshimd.sock", "template.sock"]
    finally:
        daemon.terminate()
        out, _ = daemon.communicate(timeout=30)
        stop_template(os.path.join(directory, "run"))  # the shim template its pod started (config template)
    assert daemon.returncode == 0 and "Traceback" not in out, out
    assert stat.S_ISSOCK(os.lstat(path).st_mode)  # systemd's socket is systemd's to remove


def test_a_socket_at_another_path_than_the_listen_address_is_refused(directory, crictl) -> None:
    other = os.path.join(directory, "run", "other.sock")
    daemon = activated(directory, socket_path=other)
    try:
        crictl_at(crictl, other, "version")  # starts it: it refuses and exits
        out, _ = daemon.communicate(timeout=30)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.communicate()
    assert daemon.returncode == 1 and "Traceback" not in out
    assert (f"podshimd: the socket systemd passed is bound to {other!r}, but podshimd's listen address is "
            f"unix://{directory}/run/podshimd.sock: give both the same path") in out
