"""podshimctl images import / export (OCI archives and docker-archives, as skopeo makes and reads
them) and pull's progress, through podshimd, as an operator of a node without a registry uses them."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile

import pytest
import test_podshimd_images
from test_podshimd_images import blobs
from test_podshimd_podshimctl import PODSHIMCTL, ctl

from support.critools import REPO
from support.podtools import container_config, pod_config
from support.ttytools import OnTerminal

image_daemon, daemon = test_podshimd_images.image_daemon, test_podshimd_images.daemon

#: Seconds a skopeo copy between the test registry and an archive may take.
SKOPEO_TIMEOUT = 120


def skopeo_copy(source: str, destination: str) -> None:
    done = subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", "--dest-tls-verify=false",
                           source, destination], capture_output=True, text=True, timeout=SKOPEO_TIMEOUT,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def archives(test_images, tmp_path_factory):
    """The test busybox as an OCI archive and as a docker-archive, made by skopeo from the registry,
    each naming it ``localhost/archived/busybox:1.0``; and each gzip'd whole (``KIND+gzip``), as
    `docker save | gzip` makes one."""
    directory = tmp_path_factory.mktemp("archives")
    made = {}
    for kind in ("oci-archive", "docker-archive"):
        path = str(directory / f"busybox.{kind}.tar")
        skopeo_copy(f"docker://{test_images.busybox.ref}", f"{kind}:{path}:localhost/archived/busybox:1.0")
        made[kind] = path
        with open(path, "rb") as source, gzip.open(path + ".gz", "wb") as out:
            shutil.copyfileobj(source, out)
        made[kind + "+gzip"] = path + ".gz"
    return made


def run_busybox(daemon, tmp_path, image: str) -> str:
    """Run `echo imported` in a container of ``image``; what it logged."""
    pod_path, ctr_path = tmp_path / "pod.json", tmp_path / "ctr.json"
    pod_path.write_text(json.dumps(pod_config()))
    ctr_path.write_text(json.dumps({**container_config(["echo", "imported"]), "image": {"image": image}}))
    pod_id = ctl(daemon, "runp", str(pod_path)).stdout.strip()
    try:
        container_id = ctl(daemon, "create", pod_id, str(ctr_path), str(pod_path)).stdout.strip()
        ctl(daemon, "start", container_id)
        for _ in range(200):
            if json.loads(ctl(daemon, "inspect", "--json", container_id).stdout)["state"] == "CONTAINER_EXITED":
                break
            subprocess.run(["sleep", "0.05"])
        return ctl(daemon, "logs", container_id).stdout
    finally:
        ctl(daemon, "rmp", pod_id)


@pytest.mark.parametrize("kind", ["oci-archive", "docker-archive", "oci-archive+gzip", "docker-archive+gzip"])
def test_an_imported_archive_is_listed_by_its_name_and_runs(daemon, archives, kind, tmp_path) -> None:
    out = ctl(daemon, "images", "import", archives[kind]).stdout
    assert out.startswith("Imported localhost/archived/busybox:1.0: sha256:"), out
    name = "localhost/archived/busybox:1.0"
    assert ctl(daemon, "images", "-q", name).stdout == out.split()[-1] + "\n"
    assert run_busybox(daemon, tmp_path, name) == "imported\n"


def test_an_archive_import_is_checked_as_a_pull_is_and_a_damaged_one_leaves_nothing(daemon, archives, tmp_path):
    # A layer blob with one byte changed: its digest no longer matches; DATA_LOSS names it.
    damaged = str(tmp_path / "damaged.tar")
    with tarfile.open(archives["oci-archive"]) as source, tarfile.open(damaged, "w") as out:
        index = json.load(source.extractfile("index.json"))
        manifest = json.load(source.extractfile("blobs/sha256/" + index["manifests"][0]["digest"][7:]))
        layer = manifest["layers"][0]["digest"]
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else None
            if member.name == f"blobs/sha256/{layer[7:]}":
                data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
            out.addfile(member, None if data is None else io.BytesIO(data))
    before = blobs(daemon)
    failed = ctl(daemon, "images", "import", damaged, check=False)
    assert failed.returncode == 1
    assert failed.stderr.startswith(f"DATA_LOSS: archive {damaged}: blob {layer} is corrupt or truncated: its "
                                    "content's digest is sha256:"), failed.stderr
    assert ctl(daemon, "images", "-q").stdout == "" and blobs(daemon) == before
    assert os.listdir(os.path.join(daemon.state_root, "images", "content", "ingest")) == []

    # Truncated half way: the same sentence a truncated download gets, nothing kept.
    truncated = str(tmp_path / "truncated.tar")
    with open(archives["docker-archive"], "rb") as f:
        data = f.read()
    with open(truncated, "wb") as f:
        f.write(data[:len(data) // 2])
    failed = ctl(daemon, "images", "import", truncated, check=False)
    assert failed.returncode == 1 and failed.stderr.startswith("DATA_LOSS: archive "), failed.stderr
    assert "damaged or truncated" in failed.stderr or "corrupt or truncated" in failed.stderr, failed.stderr
    assert ctl(daemon, "images", "-q").stdout == "" and blobs(daemon) == before

    # A gzip'd one cut short: the same.
    with open(archives["docker-archive+gzip"], "rb") as f:
        data = f.read()
    with open(truncated, "wb") as f:
        f.write(data[:len(data) // 2])
    failed = ctl(daemon, "images", "import", truncated, check=False)
    assert failed.returncode == 1 and failed.stderr.startswith(f"DATA_LOSS: archive {truncated}"), failed.stderr
    assert "damaged or truncated" in failed.stderr or "corrupt or truncated" in failed.stderr, failed.stderr
    assert ctl(daemon, "images", "-q").stdout == "" and blobs(daemon) == before

    not_an_archive = tmp_path / "notes.txt"
    not_an_archive.write_text("hello\n")
    failed = ctl(daemon, "images", "import", str(not_an_archive), check=False)
    assert failed.returncode == 1 and "is not a tar archive" in failed.stderr, failed.stderr


@pytest.mark.parametrize("kind", ["oci-archive", "docker-archive"])
def test_an_exported_image_is_an_archive_skopeo_reads_and_podshimd_imports_back(daemon, test_images, kind,
                                                                                 tmp_path) -> None:
    busybox = test_images.busybox
    ctl(daemon, "pull", busybox.ref)
    image_id = ctl(daemon, "images", "-q", busybox.ref).stdout.strip()
    path = str(tmp_path / "out.tar")
    out = ctl(daemon, "images", "export", busybox.ref, "-o", path, "--format", kind).stdout
    assert out.startswith(f"Exported 1 image(s) to {path} (") and out.endswith(f"bytes, {kind})\n")
    # skopeo, another implementation, reads it: the same image (config digest) under the same name.
    source = f"{kind}:{path}" + (f":{busybox.ref}" if kind == "docker-archive" else "")
    inspected = subprocess.run(["skopeo", "inspect", "--raw", "--config", source], capture_output=True,
                               timeout=SKOPEO_TIMEOUT)
    assert inspected.returncode == 0, inspected.stderr
    assert "sha256:" + hashlib.sha256(inspected.stdout).hexdigest() == image_id
    ctl(daemon, "rmi", busybox.ref)
    imported = ctl(daemon, "images", "import", path).stdout
    assert imported == f"Imported {busybox.ref}: {image_id}\n"
    assert run_busybox(daemon, tmp_path, busybox.ref) == "imported\n"


def test_export_of_an_image_the_node_lacks_is_not_found_and_writes_nothing(daemon, tmp_path) -> None:
    path = tmp_path / "out.tar"
    failed = ctl(daemon, "images", "export", "nothere:1", "-o", str(path), check=False)
    assert (failed.returncode, failed.stderr) == (1, "NOT_FOUND: no such image 'nothere:1' present\n")
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def big_image(test_images):
    """An image of busybox and four layers of 16 MiB that do not compress (more than 64 MiB to
    download): a pull long enough to watch."""
    return test_images.build("bigpull", [{f"data{i}": os.urandom(16 << 20)} for i in range(4)])


def test_pull_under_json_prints_its_progress_as_events_then_its_result(daemon, big_image) -> None:
    lines = [json.loads(line) for line in ctl(daemon, "pull", "--json", big_image.ref).stdout.splitlines()]
    *events, result = lines
    assert result["up_to_date"] is False and result["image_ref"].startswith("sha256:")
    assert events and all(e["event"] == "progress" and e["image"] == big_image.ref for e in events)
    assert all(0 <= e["bytes_done"] and (not e["bytes"] or e["bytes_done"] <= e["bytes"]) for e in events)
    known = [e for e in events if e["layers"]]
    assert known and all(e["layers"] >= 5 and e["layers_done"] <= e["layers"] and e["bytes"] > 64 << 20
                         for e in known)
    assert [e["bytes_done"] for e in events] == sorted(e["bytes_done"] for e in events)
    # Pulled again: up to date (the image and every layer were there), nothing downloaded.
    again = [json.loads(line) for line in ctl(daemon, "pull", "--json", big_image.ref).stdout.splitlines()]
    assert again[-1] == {"image_ref": result["image_ref"], "up_to_date": True}


def test_pull_on_a_terminal_shows_its_layers_and_bytes_then_what_it_pulled(daemon, big_image) -> None:
    ref = re.escape(big_image.ref.encode())
    term = OnTerminal([*PODSHIMCTL, "--runtime-root", daemon.runtime_root, "pull", big_image.ref], 24, 160, cwd=REPO)
    try:
        found = term.read_until(rb"Pulling " + ref + rb": (\d+)/(\d+) layers, [0-9.]+[KMG]?i?B/6\d\.\dMiB")
        assert int(found[1]) <= int(found[2]) and int(found[2]) >= 5
        term.read_until(rb"Pulled " + ref + rb": sha256:[0-9a-f]{64}\r?\n")
        assert term.wait() == 0
    finally:
        term.close()


def test_a_pull_whose_layer_went_missing_is_not_up_to_date(daemon, test_images) -> None:
    busybox = test_images.busybox
    image_id = ctl(daemon, "pull", busybox.ref).stdout.split()[-1]
    record = os.path.join(daemon.state_root, "images", "records", image_id[7:] + ".json")
    with open(record) as f:
        digest = json.load(f)["layers"][0]["digest"]
    os.unlink(os.path.join(daemon.state_root, "images", "content", "blobs", "sha256", digest[7:]))
    assert ctl(daemon, "pull", busybox.ref).stdout == f"Pulled {busybox.ref}: {image_id}\n"
    assert ctl(daemon, "pull", busybox.ref).stdout == f"Image is up to date for {image_id}\n"
