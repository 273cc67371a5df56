"""Image references, parsed and normalised as containerd does (``reference/docker``'s
``ParseDockerRef`` over distribution's grammar).

``busybox`` is ``docker.io/library/busybox:latest``; ``quay.io/a/b`` gets ``:latest``;
``localhost:5000/x@sha256:...`` keeps its digest and gets no tag; a reference with both a tag and a
digest keeps only the digest (the digest decides what is pulled, as in containerd). The first path
component is the registry host when it has a ``.`` or a ``:`` or is ``localhost``; otherwise the
image is Docker Hub's (``docker.io``; ``index.docker.io`` is the same), and a one-component name
there is under ``library/``. Repository names are lowercase; anything else that breaks the grammar
is a :class:`ReferenceError` whose message names the reference and what is wrong. Sans-IO.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEFAULT_DOMAIN", "DEFAULT_TAG", "MAX_NAME_LENGTH", "Reference", "ReferenceError", "parse",
           "check_digest", "split_repository"]

DEFAULT_DOMAIN = "docker.io"
LEGACY_DEFAULT_DOMAIN = "index.docker.io"
OFFICIAL_REPOSITORY_PREFIX = "library/"
DEFAULT_TAG = "latest"
#: distribution's limit on a repository name, its domain included.
MAX_NAME_LENGTH = 255

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?")
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}")
_SHA256_HEX = re.compile(r"[a-f0-9]{64}")
_ANY_HEX64 = re.compile(r"[a-f0-9]{64}")


class ReferenceError(ValueError):
    """A reference that is no valid image reference; the message is one sentence naming it."""


@dataclass(frozen=True)
class Reference:
    """A normalised image reference: ``domain/path[:tag][@digest]``; at least one of tag and
    digest is set (parse gives ``latest`` when neither was)."""

    domain: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        """The repository: ``docker.io/library/busybox``."""
        return f"{self.domain}/{self.path}"

    def with_digest(self, digest: str) -> Reference:
        """This repository at ``digest``, without a tag (a repo digest as CRI lists it)."""
        return Reference(self.domain, self.path, None, digest)

    def __str__(self) -> str:
        text = self.name
        if self.tag is not None:
            text += ":" + self.tag
        if self.digest is not None:
            text += "@" + self.digest
        return text


def check_digest(digest: str, what: str = "digest") -> str:
    """``digest`` if it is a sha256 digest (``sha256:`` and 64 lowercase hex digits); otherwise a
    :class:`ReferenceError` that calls it ``what``."""
    algorithm, sep, hex_ = digest.partition(":")
    if not sep or not _DIGEST.fullmatch(digest):
        raise ReferenceError(f"{what} {digest!r} is not a digest (ALGORITHM:HEX, such as sha256:<64 hex digits>)")
    if algorithm != "sha256":
        raise ReferenceError(f"{what} {digest!r} uses the algorithm {algorithm!r}; only sha256 is supported")
    if not _SHA256_HEX.fullmatch(hex_):
        raise ReferenceError(f"{what} {digest!r} is not a sha256 digest: it needs 64 lowercase hex digits")
    return digest


def split_repository(name: str) -> tuple[str, str]:
    """(domain, path) of a repository name as written: the first component is a domain when it
    has a '.' or ':' or is 'localhost' (distribution's ``splitDomain``), else Docker Hub's."""
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        domain, path = first, rest
    else:
        domain, path = DEFAULT_DOMAIN, name
    if domain == LEGACY_DEFAULT_DOMAIN:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = OFFICIAL_REPOSITORY_PREFIX + path
    return domain, path


def parse(text: str) -> Reference:
    """The normalised :class:`Reference` of ``text`` (``busybox``, ``host:5000/a/b:1.0``,
    ``repo@sha256:...``, ``repo:tag@sha256:...``). Raises :class:`ReferenceError`."""
    if not isinstance(text, str) or not text:
        raise ReferenceError("the image reference is empty")
    if text != text.strip() or any(c.isspace() or not c.isprintable() for c in text):
        raise ReferenceError(f"image reference {text!r} has spaces or control characters")
    if _ANY_HEX64.fullmatch(text):
        # distribution refuses it, so that an image id is never taken for a repository name
        raise ReferenceError(f"image reference {text!r} is a 64-digit hex string, which names an image id, "
                             "not a repository")
    rest, at, digest = text.partition("@")
    if at:
        check_digest(digest, f"image reference {text!r}: digest")
    # A tag is after the last ':' that comes after the last '/' (a ':' before is a port).
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    tag: str | None = None
    name = rest
    if colon > slash:
        name, tag = rest[:colon], rest[colon + 1:]
        if not _TAG.fullmatch(tag):
            raise ReferenceError(f"image reference {text!r} has an invalid tag {tag!r} (letters, digits, '_', '.' "
                                 "and '-', not starting with '.' or '-', at most 128)")
    if not name:
        raise ReferenceError(f"image reference {text!r} has no repository name")
    first, sep, _ = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost") and not _DOMAIN.fullmatch(first):
        raise ReferenceError(f"image reference {text!r} has an invalid registry host {first!r}")
    domain, path = split_repository(name)
    if any(c.isupper() for c in path):
        raise ReferenceError(f"image reference {text!r}: repository name must be lowercase")
    for component in path.split("/"):
        if not _PATH_COMPONENT.fullmatch(component):
            raise ReferenceError(f"image reference {text!r} has an invalid repository name component {component!r} "
                                 "(lowercase letters and digits, separated by '.', '_', '__' or dashes)")
    if len(domain) + 1 + len(path) > MAX_NAME_LENGTH:
        raise ReferenceError(f"image reference {text!r}: the repository name is longer than {MAX_NAME_LENGTH} "
                             "characters")
    if at:
        return Reference(domain, path, None, digest)  # the digest decides; containerd drops the tag
    return Reference(domain, path, tag or DEFAULT_TAG, None)
