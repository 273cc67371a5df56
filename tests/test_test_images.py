"""The tests' own registry and images work: what tests/support/registry.py starts answers like a registry,
and what tests/support/imagebuild.py pushes reads back with skopeo (Debian's, the same containers/image
code CRI-O pulls with) and unpacks with umoci as the images' docstrings say."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile

import pytest

from support.imagebuild import BUSYBOX_ROOTFS_CHECKS, Entry, ImageConfig, layer_tar
from support.registry import running_registry

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def skopeo(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["skopeo", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"skopeo {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


def inspect(ref: str, *options: str) -> dict:
    return json.loads(skopeo("inspect", "--tls-verify=false", *options, f"docker://{ref}").stdout)


@pytest.fixture
def scratch():
    path = tempfile.mkdtemp(prefix="podshim-imgtest-")
    yield path
    shutil.rmtree(path)


def test_a_registry_answers_v2_and_leaves_nothing_when_stopped() -> None:
    with running_registry() as registry:
        status, headers, _ = registry.get("/v2/")
        assert status == 200
        assert headers["docker-distribution-api-version"] == "registry/2.0"
        directory, pid = registry.directory, registry.pid
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] in "ZX"
    assert not os.path.exists(directory)


def test_a_registry_is_stopped_and_removed_when_the_block_raises() -> None:
    with pytest.raises(KeyError), running_registry() as registry:
        directory, pid = registry.directory, registry.pid
        raise KeyError("the test failed")
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] in "ZX"
    assert not os.path.exists(directory)


def test_the_auth_registry_wants_its_credentials(auth_registry, test_images) -> None:
    from support.registry import _http_get
    status, headers, _ = _http_get(auth_registry.host, "/v2/", {})
    assert status == 401
    assert headers["www-authenticate"].startswith("Basic ")
    assert auth_registry.get("/v2/")[0] == 200
    image = test_images.push(test_images.busybox, auth_registry)
    assert inspect(image.ref, *auth_registry.skopeo_creds())["Digest"] == image.digest
    refused = skopeo("inspect", "--tls-verify=false", "--no-creds", f"docker://{image.ref}", check=False)
    assert refused.returncode != 0
    assert "unauthorized" in refused.stderr.lower() or "authentication required" in refused.stderr.lower()


def test_busybox_is_an_oci_image_of_three_layers_running_sh(test_images) -> None:
    image = test_images.busybox
    status, headers, body = image.registry.get(f"/v2/{image.repo}/manifests/{image.tag}", {"Accept": OCI_MANIFEST})
    assert (status, headers["content-type"], headers["docker-content-digest"]) == (200, OCI_MANIFEST, image.digest)
    raw = json.loads(body)
    assert raw["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    assert len(raw["layers"]) == 3
    assert {layer["mediaType"] for layer in raw["layers"]} == {"application/vnd.oci.image.layer.v1.tar+gzip"}
    config = inspect(image.ref, "--config")
    assert config["config"]["Cmd"] == ["sh"]
    assert (config["architecture"], config["os"]) == ("amd64", "linux")
    assert inspect(image.by_digest)["Digest"] == image.digest
    assert inspect(image.registry.ref("test/busybox:latest"))["Digest"] == image.digest


def test_busybox_v2s2_is_the_same_image_as_docker_schema_2(test_images) -> None:
    raw = json.loads(skopeo("inspect", "--tls-verify=false", "--raw",
                            f"docker://{test_images.busybox_v2s2.ref}").stdout)
    assert raw["mediaType"] == DOCKER_MANIFEST
    assert {layer["mediaType"] for layer in raw["layers"]} == {"application/vnd.docker.image.rootfs.diff.tar.gzip"}
    assert inspect(test_images.busybox_v2s2.ref)["Layers"] == inspect(test_images.busybox.ref)["Layers"]


def test_multiarch_is_an_index_of_amd64_and_arm64_and_resolves_to_amd64(test_images) -> None:
    image = test_images.multiarch
    raw = json.loads(skopeo("inspect", "--tls-verify=false", "--raw", f"docker://{image.ref}").stdout)
    assert raw["mediaType"] == OCI_INDEX
    assert set(image.platforms) == {"linux/amd64", "linux/arm64"}
    assert image.platforms["linux/amd64"] == test_images.busybox.digest
    amd = inspect(image.ref)  # skopeo picks this machine's platform from the index (its Digest: the index's)
    assert (amd["Digest"], amd["Architecture"]) == (image.digest, "amd64")
    assert amd["Layers"] == inspect(test_images.busybox.ref)["Layers"]
    arm = inspect(image.ref, "--override-arch", "arm64")
    assert arm["Architecture"] == "arm64"
    assert arm["Layers"] == inspect(image.registry.ref(f"test/multiarch@{image.platforms['linux/arm64']}"),
                                    "--override-arch", "arm64")["Layers"]


def test_busybox_unpacks_with_its_whiteout_and_opaque_directory_applied_and_runs(test_images, scratch) -> None:
    layout, bundle = os.path.join(scratch, "oci"), os.path.join(scratch, "bundle")
    skopeo("copy", "--quiet", "--src-tls-verify=false", f"docker://{test_images.busybox.ref}", f"oci:{layout}:b")
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:b", bundle], check=True, capture_output=True)
    rootfs = os.path.join(bundle, "rootfs")
    for path, content in BUSYBOX_ROOTFS_CHECKS.items():
        if content is None:
            assert not os.path.lexists(os.path.join(rootfs, path)), path
        else:
            with open(os.path.join(rootfs, path), "rb") as f:
                assert f.read() == content, path
    assert os.listdir(os.path.join(rootfs, "podshim-test/opaque")) == ["new"]
    assert os.stat(os.path.join(rootfs, "podshim-test/hardlink")).st_nlink == 2
    ran = subprocess.run(["chroot", rootfs, "/bin/sh", "-c", "cat /podshim-test/layer; id -un"],
                         capture_output=True, text=True, timeout=30)
    assert (ran.returncode, ran.stdout) == (0, "3\nroot\n")


def test_a_custom_image_carries_its_files_and_config(test_images, scratch) -> None:
    config = ImageConfig(entrypoint=("/bin/httpd", "-f"), cmd=("-p", "8080"), env=("PATH=/bin", "GREETING=hi"),
                         working_dir="/var/www", user="nobody", exposed_ports=("8080/tcp",),
                         labels=(("podshim.test", "yes"),))
    image = test_images.build("custom-web", [{"var/www/index.html": "hello\n",
                                              "var/www/tool": Entry("", data=b"#!/bin/sh\n", mode=0o755)}], config)
    assert test_images.build("custom-web", [{"var/www/index.html": "hello\n",
                                             "var/www/tool": Entry("", data=b"#!/bin/sh\n", mode=0o755)}],
                             config) is image
    got = inspect(image.ref, "--config")["config"]
    assert got["Entrypoint"] == ["/bin/httpd", "-f"]
    assert got["Cmd"] == ["-p", "8080"]
    assert got["Env"] == ["PATH=/bin", "GREETING=hi"]
    assert (got["WorkingDir"], got["User"]) == ("/var/www", "nobody")
    assert got["ExposedPorts"] == {"8080/tcp": {}}
    assert got["Labels"] == {"podshim.test": "yes"}
    assert len(inspect(image.ref)["Layers"]) == 4  # busybox's three and its own


def test_a_custom_image_on_no_base_and_as_docker_schema_2(test_images) -> None:
    image = test_images.build("scratch-v2s2", [{"hello": "world\n"}], ImageConfig(cmd=("/hello",)), base=None,
                              format="v2s2")
    raw = json.loads(skopeo("inspect", "--tls-verify=false", "--raw", f"docker://{image.ref}").stdout)
    assert raw["mediaType"] == DOCKER_MANIFEST
    assert len(raw["layers"]) == 1
    assert inspect(image.ref, "--config")["config"]["Cmd"] == ["/hello"]


def test_a_hard_link_header_carries_its_targets_mode() -> None:
    # containerd applies a hard link's header mode to the shared inode: a 0644 link to busybox
    # would leave every applet unexecutable.
    archive = layer_tar([Entry("bin/busybox", data=b"\x7fELF", mode=0o755), Entry("bin/sh", "link", target="bin/busybox")])
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        link = tar.getmember("bin/sh")
    assert (link.type, link.linkname, link.mode) == (tarfile.LNKTYPE, "bin/busybox", 0o755)
