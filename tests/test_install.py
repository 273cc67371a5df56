"""What .ci/install leaves on a node: commands that keep running when the checkout they were
installed from is moved or deleted (a copy, the default), a sentence instead of a traceback when the
code an editable install points to is gone, and a podshimd that refuses to start, with a sentence,
without the CRI code the install generates.

The installs go into a venv and a command directory of the test's own (PODSHIM_VENV, PODSHIM_BIN),
from copies of this checkout's files, never into the machine's /opt/podshim or /usr/local/bin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from support.critools import REPO, podshimd_argv

#: Seconds an install may take: a new venv and every dependency from the registry, about a minute idle.
INSTALL_TIMEOUT = 900


def copy_checkout(destination: str, *, generated: bool = False) -> str:
    """The files of this checkout (tracked, and new ones git does not ignore) copied to
    ``destination``; with ``generated``, the CRI code compiled into shim/cri/api too."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    if generated:
        listed += [os.path.join("shim", "cri", "api", name)
                   for name in os.listdir(os.path.join(REPO, "shim", "cri", "api")) if "_pb2" in name]
    for name in filter(None, listed):
        source = os.path.join(REPO, name)
        if not os.path.lexists(source):
            continue
        os.makedirs(os.path.join(destination, os.path.dirname(name)), exist_ok=True)
        shutil.copy2(source, os.path.join(destination, name), follow_symlinks=False)
    return destination


def paths(venv: str, bin_dir: str) -> dict[str, str]:
    """The environment of an install into ``venv`` and ``bin_dir``, its units, docs, manual page and
    completion beside ``bin_dir`` (units/, doc/, man/, completions/), never the machine's."""
    top = os.path.dirname(bin_dir)
    return {"PODSHIM_VENV": venv, "PODSHIM_BIN": bin_dir, "PODSHIM_UNIT_DIR": os.path.join(top, "units"),
            "PODSHIM_DOC_DIR": os.path.join(top, "doc"), "PODSHIM_MAN_DIR": os.path.join(top, "man"),
            "PODSHIM_COMPLETION_DIR": os.path.join(top, "completions")}


def install(checkout: str, venv: str, bin_dir: str, *flags: str, columns: int = 80) -> str:
    """Run the copy's .ci/install into ``venv``, its commands linked into ``bin_dir``, from a
    terminal ``columns`` wide; what it printed."""
    done = subprocess.run([os.path.join(checkout, ".ci", "install"), *flags], cwd="/", stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
                          env={**os.environ, **paths(venv, bin_dir), "COLUMNS": str(columns)})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def run(*argv: str) -> subprocess.CompletedProcess:
    """Run an installed command as a node would: without the PYTHONPATH a test run may set (a
    checkout's code would be found through it)."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return subprocess.run(argv, cwd="/", stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A venv path of the module's own (the installs make it), removed afterwards."""
    path = tmp_path_factory.mktemp("install") / "venv"
    yield str(path)
    shutil.rmtree(path, ignore_errors=True)


def test_the_installed_commands_run_after_the_checkout_is_deleted(venv, tmp_path) -> None:
    checkout, bin_dir = copy_checkout(str(tmp_path / "checkout")), tmp_path / "bin"
    bin_dir.mkdir()
    first = install(checkout, venv, str(bin_dir))
    assert f"install: {tmp_path}/units/podshimd.service\n" in first
    assert f"install: {tmp_path}/doc/docs/operator-guide.md\n" in first
    assert f"install: {tmp_path}/man/man1/podshimctl.1\n" in first
    # A second run changes nothing, from a terminal of another width too (the manual page is made anew).
    assert install(checkout, venv, str(bin_dir), columns=200) == ""
    shutil.rmtree(checkout)
    for name in ("podshim", "podshimctl", "podshimd", "podshim-sandboxer"):
        done = run(str(bin_dir / name), "--help")
        assert (done.returncode, done.stderr) == (0, ""), name
        assert done.stdout.startswith(f"usage: {name} ")
    done = run(str(bin_dir / "containerd-shim-podshim-v1"), "-v")  # containerd's runtime io.containerd.podshim.v1
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("containerd-shim-podshim-v1: ")
    generated = run(os.path.join(venv, "bin", "python"), "-I", "-c",
                    "from shim.cri.api import api_pb2_grpc; print(api_pb2_grpc.RuntimeServiceStub.__name__)")
    assert (generated.returncode, generated.stdout, generated.stderr) == (0, "RuntimeServiceStub\n", "")
    generated = run(os.path.join(venv, "bin", "python"), "-I", "-c", "from shim.containerd.api import load; "
                    "print(load('runtime.sandbox.v1.sandbox_pb2').DESCRIPTOR.services_by_name['Sandbox'].full_name)")
    assert (generated.returncode, generated.stdout, generated.stderr) == (0, "containerd.runtime.sandbox.v1.Sandbox\n", "")


def test_an_editable_install_whose_checkout_is_gone_says_so(venv, tmp_path) -> None:
    checkout, bin_dir = copy_checkout(str(tmp_path / "checkout"), generated=True), tmp_path / "private" / "bin"
    # A private install (its own venv and command directory, no other path named): the command
    # directory is made, and its units, docs, manual page and completion stay under its venv.
    done = subprocess.run([os.path.join(checkout, ".ci", "install"), "--editable"], cwd="/", stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("PODSHIM_")},
                               "PODSHIM_VENV": venv, "PODSHIM_BIN": str(bin_dir)})
    assert done.returncode == 0, done.stdout + done.stderr
    written = [line.removeprefix("install: ") for line in done.stdout.splitlines() if line.startswith("install: /")]
    assert f"{venv}/lib/systemd/system/podshimd.service" in written
    assert f"{venv}/share/doc/podshim/docs/operator-guide.md" in written
    assert f"{venv}/share/man/man1/podshimctl.1" in written
    assert f"{bin_dir}/podshimctl -> {venv}/bin/podshimctl" in written
    assert all(line.startswith((venv + "/", str(bin_dir) + "/")) for line in written), done.stdout
    assert run(str(bin_dir / "podshimctl"), "--help").returncode == 0
    shutil.rmtree(checkout)
    for name in ("podshim", "podshimctl", "podshimd", "containerd-shim-podshim-v1", "podshim-sandboxer"):
        done = run(str(bin_dir / name), "--help")
        assert (done.returncode, done.stdout) == (1, ""), name
        assert done.stderr == (f"{name}: the checkout {checkout} that {venv} was installed from (an editable "
                               f"install) is gone: reinstall podshim with .ci/install\n")


def test_podshimd_without_the_generated_cri_code_refuses_to_start(tmp_path) -> None:
    checkout = copy_checkout(str(tmp_path / "checkout"))  # git ignores the generated code: not copied
    assert not [name for name in os.listdir(os.path.join(checkout, "shim", "cri", "api")) if "_pb2" in name]
    (tmp_path / "config.toml").write_text("")
    done = subprocess.run(podshimd_argv(str(tmp_path)), cwd=checkout, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("podshimd: the CRI code that .ci/install generates (shim.cri.api.api_pb2) is missing: "
                           "install podshim with .ci/install (in a development checkout, .ci/gotool schemas "
                           "makes it)\n")
    assert not os.path.exists(tmp_path / "state") and not os.path.exists(tmp_path / "run")


# Last in the module: it uninstalls the module's venv.
def test_uninstall_removes_the_pods_the_daemon_and_every_installed_file_and_the_state_only_with_purge(venv, tmp_path) -> None:
    checkout, bin_dir = copy_checkout(str(tmp_path / "checkout")), tmp_path / "bin"
    bin_dir.mkdir()
    install(checkout, venv, str(bin_dir))
    env = {**os.environ, **paths(venv, str(bin_dir))}
    (tmp_path / "net.d").mkdir()
    config = tmp_path / "etc" / "config.toml"
    config.parent.mkdir()
    config.write_text(f'state_root = "{tmp_path}/state"\nruntime_root = "{tmp_path}/run"\n'
                      f'cni_conf_dir = "{tmp_path}/net.d"\n')
    endpoint = f"unix://{tmp_path}/run/podshimd.sock"
    # podshimctl's manual page and bash completion are installed where man and bash-completion look.
    page, completion = tmp_path / "man" / "man1" / "podshimctl.1", tmp_path / "completions" / "podshimctl"
    if shutil.which("man"):
        shown = run("env", "MANWIDTH=100", "MANPAGER=cat", "man", "-M", str(tmp_path / "man"), "podshimctl")
        assert shown.returncode == 0 and "podshimctl port-forward" in shown.stdout, shown
    assert page.read_text().startswith('.TH PODSHIMCTL "1" ')
    probe = (f"source {completion}; COMP_WORDS=(podshimctl po); COMP_CWORD=1; COMP_LINE='podshimctl po'; "
             "COMP_POINT=${#COMP_LINE}; _shtab_podshimctl; printf '%s\\n' \"${COMPREPLY[@]}\"")
    assert run("bash", "-c", probe).stdout.split() == ["pods", "port-forward"]
    daemon = subprocess.Popen([str(bin_dir / "podshimd"), "--config", str(config)], cwd="/", stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ctl = [str(bin_dir / "podshimctl"), "--endpoint", endpoint]
        deadline = time.monotonic() + 60
        while run(*ctl, "version").returncode != 0:
            assert daemon.poll() is None and time.monotonic() < deadline, "podshimd did not answer"
            time.sleep(0.1)
        pod = run(*ctl, "runp", os.path.join(REPO, "examples", "pod-config.json")).stdout.strip()
        pause = json.loads(run(*ctl, "inspectp", "--json", pod).stdout)["info"]["pid"]

        done = subprocess.run([os.path.join(checkout, ".ci", "uninstall"), "--config", str(config)], cwd="/",
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"uninstall: podshimctl rmp {pod}\n" in done.stdout
        assert daemon.wait(timeout=10) == 0  # SIGTERM: a clean stop
        assert not os.path.exists(f"/proc/{pause}")
        assert os.listdir(bin_dir) == [] and not os.path.exists(venv)
        assert os.listdir(tmp_path / "units") == [] and not os.path.exists(tmp_path / "doc")
        assert not os.path.exists(page) and not os.path.exists(completion)
        assert not os.path.exists(tmp_path / "run")
        assert os.path.isdir(tmp_path / "state") and config.exists()  # the state stays unless asked
        assert "--purge removes them" in done.stdout
        removed = [line.removeprefix("uninstall: removed ") for line in done.stdout.splitlines() if " removed " in line]
        assert all(path.startswith((str(tmp_path) + "/", venv)) for path in removed), done.stdout  # nothing of the machine

        done = subprocess.run([os.path.join(checkout, ".ci", "uninstall"), "--purge", "--config", str(config)],
                              cwd="/", stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert not os.path.exists(tmp_path / "state") and not os.path.exists(config.parent)
        removed = [line.removeprefix("uninstall: removed ") for line in done.stdout.splitlines() if " removed " in line]
        assert removed and all(path.startswith(str(tmp_path) + "/") for path in removed), done.stdout
    finally:
        if os.path.exists(tmp_path / "state"):  # it failed: the pod and the daemon go, as uninstall takes them
            subprocess.run([os.path.join(checkout, ".ci", "uninstall"), "--purge", "--config", str(config)], cwd="/",
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=120, env=env)
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
