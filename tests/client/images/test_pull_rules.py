"""The sans-IO parts of a pull: what skopeo is given (registries.conf, the auth file) and what its
errors mean; the image records' file."""

from __future__ import annotations

import base64
import json
import os
import tomllib
from typing import Any

import pytest

from shim.rpc.status import Code, DataLoss, NotFound

from client.images.manifests import select_platform
from client.images.reference import parse
from client.images.skopeo import AuthConfig, RegistryHost, auth_file, registries_conf, skopeo_error
from client.images.store import ImageRecord, ImageStore

REF = parse("127.0.0.1:5000/test/busybox:1.0")
A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


def fatal(message: str) -> str:
    return f'time="2026-12-01T07:35:42Z" level=fatal msg="{message}"\n'


@pytest.mark.parametrize("stderr, code, says", [
    (fatal('Error parsing image name \\"docker://x\\": reading manifest 1.0 in 127.0.0.1:5000/test/busybox: '
           'manifest unknown: manifest unknown'), Code.NOT_FOUND,
     "image 127.0.0.1:5000/test/busybox:1.0 not found: 127.0.0.1:5000 has no such repository, tag or digest"),
    (fatal("reading manifest 1.0 in 127.0.0.1:5000/test/busybox: unauthorized: authentication required"),
     Code.UNAUTHENTICATED, "unauthorized: 127.0.0.1:5000 wants credentials to pull"),
    (fatal(f"writing blob: happened during read: Digest did not match, expected {A}, got {B}"), Code.DATA_LOSS,
     f"image 127.0.0.1:5000/test/busybox:1.0: blob {A} is corrupt or truncated: the registry sent content whose "
     f"digest is {B}"),
    (fatal(f"reading blob {A}: Error fetching blob: invalid status code from registry 404 (Not Found)"),
     Code.NOT_FOUND, f"blob {A} not found in 127.0.0.1:5000"),
    (fatal('pinging container registry 127.0.0.1:5000: Get \\"https://127.0.0.1:5000/v2/\\": dial tcp '
           '127.0.0.1:5000: connect: connection refused'), Code.UNAVAILABLE, "127.0.0.1:5000 cannot be reached"),
    (fatal('pinging container registry 127.0.0.1:5000: Get \\"https://127.0.0.1:5000/v2/\\": http: server gave '
           'HTTP response to HTTPS client'), Code.UNAVAILABLE, 'insecure = true'),
    (fatal("requested access to the resource is denied"), Code.PERMISSION_DENIED, "access denied"),
    ("panic: something odd\n", Code.UNKNOWN, "pulling 127.0.0.1:5000/test/busybox:1.0 failed: panic: something odd"),
    ("", Code.UNKNOWN, "failed: no error message"),
])
def test_skopeos_errors_become_a_status_and_a_sentence(stderr, code, says) -> None:
    error = skopeo_error(stderr, REF)
    assert error.code == code
    assert says in error.message
    assert "Traceback" not in error.message and "level=fatal" not in error.message


def test_wrong_credentials_are_said_to_be_wrong() -> None:
    error = skopeo_error(fatal("unauthorized: authentication required"), REF, credentials=True)
    assert error.code == Code.UNAUTHENTICATED and "refused the credentials given" in error.message


def test_registries_conf_has_each_host_its_mirrors_and_plain_http() -> None:
    text = registries_conf([RegistryHost("docker.io", mirrors=("127.0.0.1:5000", "mirror.example")),
                            RegistryHost("127.0.0.1:5000", insecure=True)])
    conf = tomllib.loads(text)
    assert conf["unqualified-search-registries"] == []
    docker, local = conf["registry"]
    assert docker == {"prefix": "docker.io", "location": "docker.io", "insecure": False,
                      "mirror": [{"location": "127.0.0.1:5000", "insecure": True},
                                 {"location": "mirror.example", "insecure": False}]}
    assert local == {"prefix": "127.0.0.1:5000", "location": "127.0.0.1:5000", "insecure": True}


def _decoded(doc, host):
    return base64.b64decode(doc["auths"][host]["auth"]).decode()


def test_the_auth_file_holds_username_and_password_for_the_registry_and_its_mirrors() -> None:
    doc = auth_file(REF, AuthConfig(username="u", password="p:w"), [RegistryHost(REF.domain, mirrors=("m.io",))])
    assert set(doc["auths"]) == {"127.0.0.1:5000", "m.io"}
    assert _decoded(doc, "127.0.0.1:5000") == "u:p:w"


def test_the_auth_file_takes_the_auth_field_and_an_identity_token() -> None:
    doc = auth_file(REF, AuthConfig(auth=base64.b64encode(b"u:p").decode()))
    assert _decoded(doc, REF.domain) == "u:p"
    doc = auth_file(REF, AuthConfig(identity_token="refresh-me"))
    assert doc["auths"][REF.domain]["identitytoken"] == "refresh-me"
    assert _decoded(doc, REF.domain) == "<token>:"  # containers/image reads the token only beside an auth


def test_docker_hubs_server_addresses_are_docker_io() -> None:
    ref = parse("busybox")
    for address in ("https://index.docker.io/v1/", "docker.io", "registry-1.docker.io"):
        assert set(auth_file(ref, AuthConfig(username="u", password="p", server_address=address))["auths"]) == \
            {"docker.io"}
    assert auth_file(ref, AuthConfig(username="u", password="p", server_address="quay.io")) == {"auths": {}}


def test_no_credentials_is_an_empty_auth_file() -> None:
    assert auth_file(REF, None) == {"auths": {}} == auth_file(REF, AuthConfig())


def test_an_auth_config_never_shows_its_secrets() -> None:
    auth = AuthConfig(username="u", password="hunter2", registry_token="tok", identity_token="id")
    assert "hunter2" not in repr(auth) and "tok" not in repr(auth) and "'id'" not in repr(auth)


def test_a_platform_is_picked_from_an_index_with_its_variant() -> None:
    index = {"manifests": [
        {"mediaType": "m", "digest": A, "size": 1, "platform": {"os": "linux", "architecture": "arm", "variant": "v6"}},
        {"mediaType": "m", "digest": B, "size": 2, "platform": {"os": "linux", "architecture": "arm", "variant": "v7"}},
    ]}
    assert select_platform(index, {"os": "linux", "architecture": "arm", "variant": "v7"}, "x").digest == B
    with pytest.raises(NotFound, match="has no image for linux/amd64"):
        select_platform(index, {"os": "linux", "architecture": "amd64"}, "x")
    with pytest.raises(DataLoss):
        select_platform({"manifests": "no"}, {"os": "linux", "architecture": "amd64"}, "x")


def record(image_id: str, *tags: str, config: dict[str, Any] | None = None) -> ImageRecord:
    return ImageRecord(image_id=image_id, repo_tags=tags, repo_digests=(), manifest_digest=A, manifests=(A,),
                       config={"rootfs": {"type": "layers", "diff_ids": []}} if config is None else config)


def test_image_records_of_another_version_are_refused_with_a_sentence(tmp_path) -> None:
    (tmp_path / "images.json").write_text(json.dumps({"version": 99, "images": []}))
    with pytest.raises(DataLoss, match="have version 99; this podshim reads version 1"):
        ImageStore(str(tmp_path)).load()


def test_an_earlier_images_json_is_split_into_a_file_per_image(tmp_path, caplog) -> None:
    one, two = record("sha256:" + "1" * 64, "x/one:1"), record("sha256:" + "2" * 64, "x/two:1")
    (tmp_path / "images.json").write_text(json.dumps({"version": 1, "images": [
        one.to_json(), {"image_id": "broken"}, two.to_json()]}))
    store = ImageStore(str(tmp_path)).load()
    assert sorted(store.list(), key=lambda r: r.image_id) == [one, two]
    assert "image record 1 of" in caplog.text and "is malformed, so its image is left out" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["records"]
    assert sorted(os.listdir(tmp_path / "records")) == ["1" * 64 + ".json", "2" * 64 + ".json"]
    assert ImageStore(str(tmp_path)).load().list() == store.list()


def test_a_change_to_one_image_writes_its_record_only(tmp_path) -> None:
    store = ImageStore(str(tmp_path)).load()
    store.add(record("sha256:" + "1" * 64, "x/one:1"))
    first = os.stat(tmp_path / "records" / ("1" * 64 + ".json"))
    store.add(record("sha256:" + "2" * 64, "x/two:1"))
    store.remove("sha256:" + "2" * 64)
    assert os.stat(tmp_path / "records" / ("1" * 64 + ".json")).st_ino == first.st_ino  # not written again
    assert os.listdir(tmp_path / "records") == ["1" * 64 + ".json"]
    store.add(record("sha256:" + "3" * 64, "x/one:1"))  # the tag moves: both records change
    assert [r.repo_tags for r in ImageStore(str(tmp_path)).load().list()] == [("x/one:1",)]


@pytest.mark.parametrize("content, says", [
    (b"{not json", "is not valid JSON"),
    (json.dumps({"version": 2}).encode(), "it has version 2; this podshim reads version 1"),
    (None, "its config: rootfs is the string 'layers', not an object"),
])
def test_a_record_that_cannot_be_read_is_left_out_with_a_warning_and_removable(tmp_path, caplog, content, says) -> None:
    store = ImageStore(str(tmp_path)).load()
    good, bad = record("sha256:" + "1" * 64, "x/good:1"), record("sha256:" + "2" * 64, "x/bad:1")
    store.add(good)
    store.add(bad)
    path = tmp_path / "records" / ("2" * 64 + ".json")
    if content is None:
        doc = json.loads(path.read_bytes())
        doc["config"] = {"rootfs": "layers"}
        content = json.dumps(doc).encode()
    path.write_bytes(content)
    store = ImageStore(str(tmp_path)).load()
    assert store.list() == [good]
    assert f"image record {path} cannot be read, so image sha256:{'2' * 64} is left out" in caplog.text
    assert says in caplog.text
    assert store.unreadable("2" * 64) == "sha256:" + "2" * 64
    store.remove("sha256:" + "2" * 64)
    assert not path.exists() and ImageStore(str(tmp_path)).load().list() == [good]


def test_a_tag_move_cut_short_between_its_two_writes_leaves_the_tag_on_the_image_recorded_last(tmp_path, caplog):
    store = ImageStore(str(tmp_path)).load()
    old = store.add(record("sha256:" + "1" * 64, "docker.io/x/app:1", "docker.io/x/app:old"))
    before = (tmp_path / "records" / ("1" * 64 + ".json")).read_bytes()
    store.add(record("sha256:" + "2" * 64, "docker.io/x/app:1"))
    (tmp_path / "records" / ("1" * 64 + ".json")).write_bytes(before)  # as if killed before its second write
    store = ImageStore(str(tmp_path)).load()
    assert store.resolve("docker.io/x/app:1").image_id == "sha256:" + "2" * 64
    assert store.get(old.image_id).repo_tags == ("docker.io/x/app:old",)
    assert "tag docker.io/x/app:1 was on 2 images (a change was cut short); it stays on sha256:" + "2" * 64 in caplog.text
    assert ImageStore(str(tmp_path)).load().get(old.image_id).repo_tags == ("docker.io/x/app:old",)  # repaired on disk
