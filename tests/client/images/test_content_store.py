"""The content store: only verified blobs are ever visible, under blobs/sha256/<hex>."""

from __future__ import annotations

import os

import pytest

from client.images.content import BlobError, ContentStore, sha256_digest

DATA = b"a layer's bytes\n" * 1000


@pytest.fixture
def store(tmp_path):
    return ContentStore(str(tmp_path / "content")).open()


def test_a_blob_is_stored_under_its_digest(store) -> None:
    digest = sha256_digest(DATA)
    path = store.add_bytes(DATA, digest)
    assert path == os.path.join(store.root, "blobs", "sha256", digest[len("sha256:"):])
    assert store.has(digest) and store.read(digest) == DATA
    assert store.digests() == {digest}
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_bytes_with_another_digest_are_refused_and_nothing_is_stored(store) -> None:
    wrong = sha256_digest(b"something else")
    with pytest.raises(BlobError, match=f"blob {wrong} has the wrong content"):
        store.add_bytes(DATA, wrong)
    assert store.digests() == set()
    assert os.listdir(store.ingest) == []


def test_a_file_is_moved_in_once_verified(store) -> None:
    work = store.temporary_dir("pull-")
    source = os.path.join(work, "layer")
    with open(source, "wb") as f:
        f.write(DATA)
    digest = sha256_digest(DATA)
    path = store.add_file(source, digest, len(DATA))
    assert not os.path.exists(source)
    assert store.read(digest) == DATA and path == store.path(digest)


@pytest.mark.parametrize("content, size, says", [
    (DATA[:-10], len(DATA), "is 15990 bytes, but its descriptor says 16000: it is truncated or corrupt"),
    (DATA[:-1] + b"X", len(DATA), "has the wrong content"),
    (DATA[:-1] + b"X", None, "has the wrong content"),
])
def test_a_truncated_or_corrupt_file_is_never_visible(store, content, size, says) -> None:
    work = store.temporary_dir("pull-")
    source = os.path.join(work, "layer")
    with open(source, "wb") as f:
        f.write(content)
    digest = sha256_digest(DATA)
    with pytest.raises(BlobError) as caught:
        store.add_file(source, digest, size)
    assert str(caught.value).startswith(f"blob {digest} ") and says in str(caught.value)
    assert not store.has(digest)
    assert os.path.exists(source)  # left to its owner, who removes its directory


def test_a_symbolic_link_is_not_taken_for_a_blob(store, tmp_path) -> None:
    target = tmp_path / "outside"
    target.write_bytes(DATA)
    work = store.temporary_dir("pull-")
    os.symlink(target, os.path.join(work, "layer"))
    with pytest.raises(OSError):
        store.add_file(os.path.join(work, "layer"), sha256_digest(DATA), len(DATA))
    assert store.digests() == set()


def test_what_a_killed_writer_left_in_ingest_is_removed_at_open(store) -> None:
    work = store.temporary_dir("pull-")
    with open(os.path.join(work, "half-a-layer"), "wb") as f:
        f.write(DATA[:100])
    ContentStore(store.root).open()
    assert os.listdir(store.ingest) == []
    assert store.digests() == set()


def test_a_bad_digest_is_refused(store) -> None:
    with pytest.raises(BlobError, match="only sha256"):
        store.path("md5:" + "a" * 32)
    with pytest.raises(BlobError, match="is not a digest"):
        store.has("../../etc/passwd")


def test_remove_says_whether_the_blob_was_there(store) -> None:
    digest = sha256_digest(DATA)
    store.add_bytes(DATA, digest)
    assert store.remove(digest) is True
    assert store.remove(digest) is False
    assert not store.has(digest)


def replace_with_a_link(store, digest, target) -> str:
    """The blob ``digest`` replaced by a symbolic link to ``target`` (what someone's hand did)."""
    path = store.path(digest)
    os.unlink(path)
    os.symlink(target, path)
    return path


LINK_TARGETS = {"same bytes": DATA, "other bytes": b"other bytes", "nothing": None}


@pytest.fixture(params=LINK_TARGETS)
def linked_blob(request, store, tmp_path):
    """A stored blob replaced by a symbolic link to a file of the same bytes, of other bytes, or to
    nothing; its digest, its path, and the link's target with what that holds."""
    digest = sha256_digest(DATA)
    store.add_bytes(DATA, digest)
    outside, content = tmp_path / "outside", LINK_TARGETS[request.param]
    if content is not None:
        outside.write_bytes(content)
    return digest, replace_with_a_link(store, digest, outside), outside, content


def test_a_blob_replaced_by_a_symbolic_link_is_damaged_and_read_removes_it_without_following(store, linked_blob) -> None:
    digest, path, outside, content = linked_blob
    with pytest.raises(BlobError, match=f"^blob {digest} was damaged in the content store \\(it is a symbolic "
                                        "link\\); it was removed, and a pull fetches it again$"):
        store.read(digest)
    assert not os.path.lexists(path) and not store.has(digest)
    assert (outside.read_bytes() if content is not None else None) == content


def test_a_blob_replaced_by_a_symbolic_link_fails_its_check_and_is_removed(store, linked_blob) -> None:
    digest, path, outside, content = linked_blob
    assert store.check(digest) is False
    assert not os.path.lexists(path)
    assert (outside.read_bytes() if content is not None else None) == content


def test_a_blob_added_over_a_symbolic_link_replaces_the_link(store, tmp_path) -> None:
    digest = sha256_digest(DATA)
    store.add_bytes(DATA, digest)
    outside = tmp_path / "outside"
    outside.write_bytes(DATA)
    path = replace_with_a_link(store, digest, outside)
    assert store.add_bytes(DATA, digest) == path
    assert not os.path.islink(path) and store.has(digest) and store.read(digest) == DATA
