"""Image references normalised as containerd normalises them (reference/docker.ParseDockerRef)."""

from __future__ import annotations

import pytest

from client.images.reference import Reference, ReferenceError, parse

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text, normalised", [
    ("busybox", "docker.io/library/busybox:latest"),
    ("busybox:1.36", "docker.io/library/busybox:1.36"),
    ("library/busybox", "docker.io/library/busybox:latest"),
    ("docker.io/busybox", "docker.io/library/busybox:latest"),
    ("index.docker.io/busybox", "docker.io/library/busybox:latest"),
    ("docker.io/library/busybox:latest", "docker.io/library/busybox:latest"),
    ("someone/tool:v1", "docker.io/someone/tool:v1"),
    ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
    ("quay.io/a/b/c", "quay.io/a/b/c:latest"),
    ("localhost/x", "localhost/x:latest"),
    ("localhost:5000/x:1", "localhost:5000/x:1"),
    ("127.0.0.1:39001/test/busybox:1.0", "127.0.0.1:39001/test/busybox:1.0"),
    ("my-registry:5000/a_b/c.d/e--f__g", "my-registry:5000/a_b/c.d/e--f__g:latest"),
    (f"busybox@{DIGEST}", f"docker.io/library/busybox@{DIGEST}"),
    (f"127.0.0.1:5000/a@{DIGEST}", f"127.0.0.1:5000/a@{DIGEST}"),
    (f"busybox:1.36@{DIGEST}", f"docker.io/library/busybox@{DIGEST}"),  # the digest decides; the tag is dropped
    ("busybox:Tag_1.x-y", "docker.io/library/busybox:Tag_1.x-y"),
])
def test_references_are_normalised_as_containerd_does(text, normalised) -> None:
    assert str(parse(text)) == normalised


def test_a_reference_has_its_parts() -> None:
    ref = parse("127.0.0.1:5000/test/busybox:1.0")
    assert ref == Reference("127.0.0.1:5000", "test/busybox", "1.0", None)
    assert ref.name == "127.0.0.1:5000/test/busybox"
    assert str(ref.with_digest(DIGEST)) == f"127.0.0.1:5000/test/busybox@{DIGEST}"


@pytest.mark.parametrize("text, says", [
    ("", "empty"),
    ("Busybox", "must be lowercase"),
    ("docker.io/Library/busybox", "must be lowercase"),
    ("busy box", "spaces"),
    (" busybox", "spaces"),
    ("busybox:", "invalid tag ''"),
    ("busybox:-x", "invalid tag '-x'"),
    ("busybox:" + "t" * 129, "invalid tag"),
    ("busybox@sha256:abc", "is not a digest"),
    ("busybox@sha256:" + "AB" * 32, "needs 64 lowercase hex digits"),
    ("busybox@md5:" + "ab" * 32, "only sha256 is supported"),
    ("busybox@", "is not a digest"),
    ("a//b", "invalid repository name component ''"),
    ("a/b_", "invalid repository name component 'b_'"),
    ("-bad-host.io:5000/x", "invalid registry host"),
    ("host.io:port/x", "invalid registry host"),
    (":tag", "no repository name"),
    ("ab" * 32, "names an image id"),
    ("a/" + "b" * 260, "longer than 255"),
])
def test_bad_references_are_refused_with_a_sentence(text, says) -> None:
    with pytest.raises(ReferenceError) as caught:
        parse(text)
    assert says in str(caught.value)
