"""critest's images, built by tests/support/imagebuild.py: every reference its specs pull is in the local
registry behind the mirrors a runtime is given, with the users, groups, files and programs the specs
check; and critest finds its specs (a dry run: nothing is pulled).

The critest runs themselves are tests/cri/test_podshimd_critest.py's and bench/critest_compare.py's."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from support.critools import run_critest
from support.imagebuild import CRITEST_PAUSE_IMAGES

CRITEST_SPECS, CRITEST_RUNNABLE = 142, 137


def skopeo_inspect(ref: str, *options: str) -> dict:
    done = subprocess.run(["skopeo", "inspect", "--tls-verify=false", *options, f"docker://{ref}"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"skopeo inspect {ref}: {done.stderr}"
    return json.loads(done.stdout)


@pytest.fixture
def rootfs_of(critest_image_set):
    """Unpack an image (as critest names it) with skopeo and umoci into a scratch dir: its rootfs."""
    scratch = tempfile.mkdtemp(prefix="podshim-critest-img-")

    def unpack(reference: str) -> str:
        target = os.path.join(scratch, str(len(os.listdir(scratch))))
        subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                        f"docker://{critest_image_set.local(reference)}", f"oci:{target}-oci:i"],
                       check=True, capture_output=True, timeout=120)
        subprocess.run(["umoci", "unpack", "--image", f"{target}-oci:i", target], check=True, capture_output=True,
                       timeout=120)
        return os.path.join(target, "rootfs")

    yield unpack
    shutil.rmtree(scratch)


def test_every_image_critest_pulls_is_in_the_local_registry(critest_image_set) -> None:
    images = critest_image_set
    assert len(images.pulls) == 21
    assert {images.default_image, images.web_server_image, *CRITEST_PAUSE_IMAGES} <= set(images.pulls)
    for reference in images.pulls:
        config = skopeo_inspect(images.local(reference), "--config")
        assert (config["os"], config["architecture"]) == ("linux", "amd64"), reference
    # Only upstream's digest reference cannot be made here.
    assert [ref.split("@")[0] for ref in images.unavailable] == ["gcr.io/k8s-staging-cri-tools/test-image-digest"]


def test_critests_staging_images_are_manifest_lists_like_upstreams(critest_image_set) -> None:
    for reference in critest_image_set.pulls:
        if reference.startswith("gcr.io/"):
            raw = skopeo_inspect(critest_image_set.local(reference), "--raw")
            assert raw["mediaType"] == "application/vnd.oci.image.index.v1+json", reference
            assert [m["platform"]["architecture"] for m in raw["manifests"]] == ["amd64", "arm64"], reference


def test_the_tagged_images_are_the_same_or_different_as_the_specs_count_them(critest_image_set) -> None:
    digest = {ref: skopeo_inspect(critest_image_set.local(ref))["Digest"] for ref in critest_image_set.pulls}
    staging = "gcr.io/k8s-staging-cri-tools/"
    assert len({digest[f"{staging}test-image-tags:{tag}"] for tag in "123"}) == 1
    assert len({digest[f"{staging}test-image-{n}:latest"] for n in "123"}) == 3
    assert digest[f"{staging}test-image-tag:test"] != digest[f"{staging}test-image-tag:all"]
    assert len({digest[reference] for reference in CRITEST_PAUSE_IMAGES}) == 1  # one image, two registries


def test_the_user_images_carry_the_users_the_image_status_spec_expects(critest_image_set) -> None:
    for name, user in (("test-image-user-uid", "1002"), ("test-image-user-username", "www-data"),
                       ("test-image-user-uid-group", "1003:1004"), ("test-image-user-username-group", "www-data:1004"),
                       ("test-image-predefined-group", "1000")):
        ref = critest_image_set.local(f"gcr.io/k8s-staging-cri-tools/{name}:latest")
        assert skopeo_inspect(ref, "--config")["config"]["User"] == user, name


def test_the_predefined_group_image_puts_uid_1000_in_group_50000(rootfs_of) -> None:
    rootfs = rootfs_of("gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest")
    with open(os.path.join(rootfs, "etc/group")) as f:
        assert "group-defined-in-image:x:50000:default-user\n" in f.read()
    with open(os.path.join(rootfs, "etc/passwd")) as f:
        assert "default-user:x:1000:1000:" in f.read()
    ran = subprocess.run(["chroot", rootfs, "id", "-G", "default-user"], capture_output=True, text=True, timeout=30)
    assert ran.stdout == "1000 50000\n"


def test_the_nonewprivs_program_is_setuid_root_and_prints_its_effective_uid(rootfs_of) -> None:
    rootfs = rootfs_of("registry.k8s.io/e2e-test-images/nonewprivs:1.3")
    program = os.path.join(rootfs, "usr/local/bin/nnp")
    assert os.stat(program).st_mode & 0o7777 == 0o4755 and os.stat(program).st_uid == 0
    escalated = subprocess.run(["chroot", "--userspec=1000:1000", rootfs, "/usr/local/bin/nnp"],
                               capture_output=True, text=True, timeout=30)
    assert escalated.stdout == "Effective uid: 0\n"
    held = subprocess.run(["setpriv", "--no-new-privs", "chroot", "--userspec=1000:1000", rootfs,
                           "/usr/local/bin/nnp"], capture_output=True, text=True, timeout=30)
    assert held.stdout == "Effective uid: 1000\n"


def test_the_fake_nginx_names_itself_nginx_says_master_process_and_serves_port_80(critest_image_set) -> None:
    config = skopeo_inspect(critest_image_set.local(critest_image_set.web_server_image), "--config")["config"]
    assert config["Cmd"][0] == "/usr/sbin/nginx"  # a script: its process's comm is "nginx" (pidof nginx)
    assert "master process" in " ".join(config["Cmd"])
    config = skopeo_inspect(critest_image_set.local("registry.k8s.io/e2e-test-images/httpd:2.4.39-4"),
                            "--config")["config"]
    assert config["Cmd"] == ["httpd-foreground"]  # which logs Apache's "httpd -D FOREGROUND" line
    config = skopeo_inspect(critest_image_set.local("gcr.io/k8s-staging-cri-tools/hostnet-nginx-amd64:latest"),
                            "--config")["config"]
    assert config["Cmd"][:2] == ["/usr/local/bin/serve-http", "12003"]


#: Every program critest's specs exec in the default image (pkg/validate/*.go).
SPEC_TOOLS = ("sh", "echo", "sleep", "top", "ls", "id", "ipcs", "ping", "pgrep", "pidof", "hostname", "netstat",
              "brctl", "mount", "touch", "cat", "grep", "chmod", "mkdir")


def test_the_default_image_has_every_tool_the_specs_exec_and_pgrep_finds_processes(critest_image_set, rootfs_of) -> None:
    rootfs = rootfs_of(critest_image_set.default_image)
    found = subprocess.run(["chroot", rootfs, "sh", "-c", 'for t in "$@"; do command -v "$t" || echo "no $t"; done',
                            "sh", *SPEC_TOOLS], capture_output=True, text=True, timeout=30)
    assert "no " not in found.stdout, found.stdout
    # Applets are hard links to one busybox, as in Docker Hub's image: masking /bin/ls masks ls only,
    # and the shell execs /bin/ls (no applet of its own first): masked, `sh -c ls` fails (MaskedPaths).
    assert os.stat(os.path.join(rootfs, "bin/ls")).st_ino == os.stat(os.path.join(rootfs, "bin/busybox")).st_ino
    masked = subprocess.run(["unshare", "--mount", "sh", "-c", f"mount --bind /dev/null {rootfs}/bin/ls && "
                             f"chroot {rootfs} sh -c ls"], capture_output=True, text=True, timeout=30)
    assert masked.returncode != 0 and "Permission denied" in masked.stderr, masked.stdout + masked.stderr
    os.mknod(os.path.join(rootfs, "dev/null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a runtime's /dev has it
    pgrep = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--mount-proc=" + os.path.join(rootfs, "proc"),
                            "chroot", rootfs, "sh", "-c", "sleep 30 & pgrep sleep; pgrep nosuchprocess; echo $?; "
                            "kill %1"], capture_output=True, text=True, timeout=30)
    assert pgrep.stdout.splitlines()[1:] == ["1"] and pgrep.stdout.splitlines()[0].isdigit(), pgrep.stdout + pgrep.stderr


def test_the_web_server_answers_get_and_stops_at_sigterm(critest_image_set, rootfs_of) -> None:
    rootfs = rootfs_of(critest_image_set.web_server_image)
    os.mknod(os.path.join(rootfs, "dev/null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a runtime's /dev has it
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(["chroot", rootfs, "/usr/local/bin/serve-http", str(port), "/usr/share/nginx/html"])
    try:
        deadline = time.monotonic() + 30
        while True:  # busybox httpd binds a moment after the script starts it
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
                    assert response.status == 200
                    assert b"podshim critest nginx" in response.read()
                break
            except urllib.error.URLError:
                assert server.poll() is None and time.monotonic() < deadline
                select.select([], [], [], 0.05)
        server.terminate()
        assert server.wait(timeout=10) == 0
    finally:
        server.kill()
        server.wait()


def test_critest_finds_its_specs(critest) -> None:
    # A dry run connects to nothing and pulls nothing: it counts the specs.
    result = run_critest(critest, "unix:///nonexistent/critest.sock", extra=["--ginkgo.dry-run"], timeout=300)
    assert result.returncode == 0, result.output[-3000:]
    assert (result.ran, result.total, result.passed, result.failed) == (CRITEST_RUNNABLE, CRITEST_SPECS,
                                                                      CRITEST_RUNNABLE, 0), result.output[-3000:]
