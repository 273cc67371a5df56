"""podshimctl's image verbs (pull, images, inspecti, rmi, imagefsinfo; create --with-pull) as a client
of podshimd's ImageService, against the local test registry."""

from __future__ import annotations

import json
import subprocess

import test_podshimd_images
from test_podshimd_podshimctl import PODSHIMCTL, ctl

from support.critools import REPO
from support.podtools import container_config, pod_config
from support.registry import AUTH

# The image tests' daemon (insecure test registries; images a test pulled are removed after it).
image_daemon, daemon = test_podshimd_images.image_daemon, test_podshimd_images.daemon


def test_pull_images_inspecti_rmi(daemon, test_images) -> None:
    busybox = test_images.busybox
    pulled = ctl(daemon, "pull", busybox.ref).stdout
    assert pulled.startswith(f"Pulled {busybox.ref}: sha256:")
    image_id = pulled.split()[-1]
    # "up to date" only when it was: the same image already there under that name
    assert ctl(daemon, "pull", busybox.ref).stdout == f"Image is up to date for {image_id}\n"
    table = ctl(daemon, "images").stdout.splitlines()
    repo, tag = busybox.ref.rsplit(":", 1)
    assert table[0].split() == ["IMAGE", "TAG", "IMAGE", "ID", "SIZE"]
    assert table[1].split()[:3] == [repo, tag, image_id.removeprefix("sha256:")[:13]]
    assert ctl(daemon, "images", "-q", busybox.ref).stdout == f"{image_id}\n"
    inspected = json.loads(ctl(daemon, "inspecti", busybox.ref).stdout)
    assert inspected["status"]["id"] == image_id and inspected["status"]["repo_tags"] == [busybox.ref]
    assert inspected["info"]["imageSpec"]["config"]["Cmd"] == ["sh"]
    assert ctl(daemon, "rmi", busybox.ref).stdout == f"Deleted: {busybox.ref}\n"
    assert ctl(daemon, "images", "-q").stdout == ""
    missing = ctl(daemon, "inspecti", busybox.ref, check=False)
    assert (missing.returncode, missing.stderr) == (1, f"NOT_FOUND: no such image {busybox.ref!r} present\n")


def test_pull_with_credentials_and_imagefsinfo(daemon, test_images, auth_registry) -> None:
    image = test_images.push(test_images.busybox, auth_registry)
    refused = ctl(daemon, "pull", image.ref, check=False)
    assert refused.returncode == 1 and refused.stderr.startswith("UNAUTHENTICATED: ")
    ctl(daemon, "pull", "--username", AUTH[0], "--password", AUTH[1], image.ref)
    assert ctl(daemon, "images", "-q").stdout.strip()
    info = json.loads(ctl(daemon, "imagefsinfo").stdout)["status"]
    assert int(info["used_bytes"]["value"]) > 1_000_000


def test_pulling_a_missing_image_is_not_found(daemon, test_images) -> None:
    ref = test_images.registry.ref("test/nothere:1.0")
    failed = ctl(daemon, "pull", ref, check=False)
    assert (failed.returncode, failed.stderr) == (
        1, f"NOT_FOUND: image {ref} not found: {test_images.registry.host} has no such repository, tag or digest\n")


def test_create_with_pull_pulls_the_containers_image(daemon, test_images, tmp_path) -> None:
    pod_path, ctr_path = tmp_path / "pod.json", tmp_path / "ctr.json"
    pod_path.write_text(json.dumps(pod_config()))
    ctr_path.write_text(json.dumps({**container_config(["true"]), "image": {"image": test_images.busybox.ref}}))
    pod_id = ctl(daemon, "runp", str(pod_path)).stdout.strip()
    try:
        container_id = ctl(daemon, "create", "--with-pull", pod_id, str(ctr_path), str(pod_path)).stdout.strip()
        assert ctl(daemon, "images", "-q", test_images.busybox.ref).stdout.strip()
        ctl(daemon, "rm", container_id)
    finally:
        ctl(daemon, "rmp", pod_id)


def test_bad_flags_are_a_usage_error(tmp_path) -> None:
    for argv in (["pull"], ["images", "--nope"], ["rmi"], ["pull", "--creds"]):
        result = subprocess.run([*PODSHIMCTL, "--runtime-root", str(tmp_path), *argv], cwd=REPO,
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stderr.startswith("usage: podshimctl"), argv


def test_with_no_daemon_running_an_image_verb_says_how_to_start_one(tmp_path) -> None:
    result = subprocess.run([*PODSHIMCTL, "--runtime-root", str(tmp_path), "images"], cwd=REPO,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith(f"podshimctl: podshimd is not running: nothing at {tmp_path}/podshimd.sock; "
                                    "start it with `systemctl start podshimd`")
