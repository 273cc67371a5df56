"""Pulling an image from a registry into the content store, with skopeo.

Why skopeo (Debian's ``skopeo``, containers/image underneath, the library CRI-O pulls with): it is
maintained, speaks the OCI distribution API as real registries do (bearer-token and basic auth,
identity tokens, mirrors and plain-HTTP registries from a registries.conf, Docker schema 2 and OCI
manifests, manifest lists and OCI indexes, gzip and zstd layers), and verifies every blob's digest
as it downloads. What it cannot do for us, podshim does: it keeps the registry's own manifest bytes
(so repo digests are the registry's), checks every blob again as it moves it into the content
store, and never lets a failed or interrupted pull leave anything that looks complete.

A pull of ``ref`` (:meth:`Puller.pull`), all in a private temporary directory under the content
store's ingest/ (same filesystem: blobs move in with a rename):

1. ``skopeo inspect --raw docker://REF``: the manifest or index the reference names now. Its sha256
   is the repo digest; an index or manifest list is resolved to this host's platform here.
2. ``skopeo copy docker://REF oci:WORK/image:image``, run at the same time as step 1 for an image
   the node does not have: that one platform's layers (and config and manifest), as the registry
   stores them (compressed). An OCI layout, not a dir: destination, because skopeo writes a
   layout's blobs side by side (up to 6) and a dir:'s one after another (bench/skopeo_copy.py:
   714 against 1060 ms for 106 MB in 23 layers from a local registry, at load 8.5). Its layers
   are used only if they are those of the manifest step 1 resolved; otherwise (the tag moved
   between the two, or skopeo chose another platform) it is copied again as ``NAME@DIGEST``,
   pinned to what step 1 saw. A layout is OCI, so skopeo converts a Docker schema 2 manifest and
   config on the way (the layers keep their bytes): the registry's own manifest is step 1's (or,
   for an index, asked for by digest when the layout lacks it), and the config is asked for with
   ``inspect --raw --config`` then.
3. Every blob is verified (size and sha256) and moved into the content store; the manifests too.

Steps 2 and 3 overlap, and with them the unpacking: skopeo (containers/image's ``oci_dest.go``)
writes each blob to a temporary file in the layout, fsyncs it, and renames it to
``blobs/sha256/<hex>`` once it has it all and its digest matched (seen with strace; only the
manifest is written in place, and it is never taken from there unchecked). So a layer file named
by its digest is complete: :class:`_Arrivals` watches that directory and, as each such file
appears, hashes it and hands it to the caller's ``stage`` (the service unpacks it into a staging
directory of the snapshotter) in a worker thread, while the rest download. What was hashed is
moved in by a rename without hashing it again, and what skopeo fsynced is not fsynced again: one
directory fsync makes the renames durable.

Blobs that are already in the store are not downloaded again: for a reference the node has an
image of, step 1 runs first, and step 2 is skipped when its manifest and all its blobs are there
(the manifest and config read back and checked against their digests: one damaged on disk is
removed and downloaded again; a blob downloaded again replaces what the store had). For any other
image, the layer blobs of the images the node has are hard-linked into the fresh layout before
skopeo runs (same filesystem): containers/image's OCI destination takes a blob whose file is there
(``TryReusingBlob`` stats it), so only the blobs the node lacks are downloaded (issue #17: pulling
an image on a base the node has fetched the base again, and staged it again for nothing). The linked
layers the image has are hashed before they count; a damaged one is removed from the store and
from the layout, and downloaded by a second copy into the same layout. Linked blobs are not staged:
their layers are in committed snapshots already, or are unpacked from the store. Manifests are never
linked: skopeo writes a layout's manifest in place, through any link.

Credentials (CRI's AuthConfig) go to skopeo in an auth file (containers-auth.json(5), 0600 in the
0700 work directory), never on its command line, except a
registry token, which skopeo 1.9 takes only as ``--src-registry-token``. skopeo sees only the
registries.conf, policy and auth file made for this pull (its environment is clean: no
``~/.docker/config.json`` or system registries.conf is read). A pull that overruns its timeout, or
downloads nothing for its progress timeout (a registry that stopped answering: containerd 1.7's
image_pull_progress_timeout), is killed with its process group (DeadlineExceeded); skopeo dies
with podshimd (PR_SET_PDEATHSIG).
skopeo's errors become one sentence and a status (:func:`skopeo_error`): 404 NOT_FOUND, 401
UNAUTHENTICATED, a blob whose digest does not match DATA_LOSS naming the blob, an unreachable
registry UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from client.processes import run as run_helper
from shim.rpc.files import decode_json, ensure_private_dir
from shim.rpc.trees import remove_tree, walk
from shim.rpc.status import (DataLoss, DeadlineExceeded, InvalidArgument, NotFound, PermissionDenied, RpcError, Unauthenticated,
                             Unavailable, Unknown)

from .imageconfig import MAX_CONFIG_BYTES, check_config
from .content import BlobError, ContentStore, file_digest, sha256_digest
from .reference import DEFAULT_DOMAIN, Reference, ReferenceError, check_digest

__all__ = ["PULL_TIMEOUT", "PULL_PROGRESS_TIMEOUT", "SKOPEO", "MEDIA_TYPES", "AuthConfig", "RegistryHost", "Descriptor", "Manifest",
           "Progress", "Pulled",
           "Puller", "registries_conf", "auth_file", "skopeo_error", "select_platform", "parse_manifest",
           "registry_host"]

#: Seconds a whole pull (both skopeo runs) may take by default; config.toml's image_pull_timeout.
PULL_TIMEOUT = 3600.0
#: Seconds a pull may go without a byte downloaded before it is given up (containerd 1.7's
#: image_pull_progress_timeout, 5 min); config.toml's image_pull_progress_timeout.
PULL_PROGRESS_TIMEOUT = 300.0
SKOPEO = "skopeo"
_SETPRIV = "/usr/bin/setpriv"  # util-linux: --pdeathsig, so skopeo dies with the daemon
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_LIST_V2 = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
#: The manifest types a pull accepts (schema 1 is long deprecated and refused with a sentence).
MEDIA_TYPES = (MANIFEST_V2, OCI_MANIFEST, MANIFEST_LIST_V2, OCI_INDEX)
_INDEXES = (MANIFEST_LIST_V2, OCI_INDEX)
#: Seconds between two looks at skopeo's directory for blobs it has finished.
ARRIVAL_POLL = 0.005
#: Blobs hashed and staged side by side while the rest download.
ARRIVAL_WORKERS = 3
_BLOB_NAME = re.compile(r"[0-9a-f]{64}")

log = logging.getLogger(__name__)
_DOCKER_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io", "docker.io")


# -- what a pull is given ------------------------------------------------------------------------

@dataclass(frozen=True)
class AuthConfig:
    """CRI's AuthConfig: credentials for one pull. ``auth`` is base64 ``user:password``;
    ``server_address`` (when set) is the registry they are for."""

    username: str = ""
    password: str = ""
    auth: str = ""
    server_address: str = ""
    identity_token: str = ""
    registry_token: str = ""

    def __bool__(self) -> bool:
        return any((self.username, self.password, self.auth, self.identity_token, self.registry_token))

    def __repr__(self) -> str:  # never a secret in a log line or a traceback
        return f"AuthConfig(username={self.username!r}, server_address={self.server_address!r}, ...)"


@dataclass(frozen=True)
class RegistryHost:
    """config.toml's settings for one registry host (``host`` or ``host:port``): the ``mirrors``
    tried before it, in order, and whether it speaks plain HTTP (``insecure``)."""

    host: str
    mirrors: tuple[str, ...] = ()
    insecure: bool = False


# -- what a pull gives -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Descriptor:
    """An OCI descriptor: a blob's media type, digest and size."""

    media_type: str
    digest: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """One platform's image manifest: its config and its layers, lowest first."""

    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclass
class Progress:
    """What a pull in flight shows of itself (:meth:`Puller.pull` fills it in): ``work``, its
    directory (what is downloaded so far is the bytes under it), and, once its manifest is read,
    the image's ``layers`` and their ``bytes``."""

    work: str = ""
    layers: int = 0
    bytes: int = 0
    layer_digests: frozenset[str] = frozenset()
    _seen: int = 0

    def manifest(self, manifest: Manifest) -> None:
        self.layers, self.bytes = len(manifest.layers), sum(layer.size for layer in manifest.layers)
        self.layer_digests = frozenset(layer.digest for layer in manifest.layers)

    def downloaded(self) -> int:
        """Bytes downloaded so far (at most :attr:`bytes` once that is known; never less than
        before: the blobs leave the work directory for the store at the end)."""
        done = _bytes_under(self.work) if self.work and os.path.isdir(self.work) else 0
        self._seen = max(self._seen, min(done, self.bytes) if self.bytes else done)
        return self._seen


@dataclass(frozen=True)
class Pulled:
    """An image now in the content store: ``repo_digest`` is the digest of what the reference
    named (an index when it was one), ``manifest_digest`` that of this platform's manifest;
    ``blobs`` every blob of it the store holds (manifests, config, layers)."""

    reference: Reference
    repo_digest: str
    manifest_digest: str
    manifest: Manifest
    config: dict[str, Any] = field(repr=False)
    blobs: tuple[str, ...] = ()


# -- sans-IO: what skopeo is given and what its answers mean --------------------------------------

def registry_host(server_address: str) -> str:
    """The registry host of a CRI ``server_address`` (``https://index.docker.io/v1/`` is Docker
    Hub: ``docker.io``)."""
    host = re.sub(r"^[a-z]+://", "", server_address.strip()).split("/", 1)[0]
    return DEFAULT_DOMAIN if host in _DOCKER_HUB_ALIASES else host


def registries_conf(hosts: Iterable[RegistryHost]) -> str:
    """A registries.conf (containers-registries.conf(5), version 2) of ``hosts``: nothing is
    searched for short names (references are normalised first), each host with its mirrors and
    its insecure flag; a mirror is insecure when its own host entry says so."""
    hosts = list(hosts)
    insecure = {h.host for h in hosts if h.insecure}
    lines = ["unqualified-search-registries = []", ""]
    for entry in hosts:
        lines += ["[[registry]]", f"prefix = {json.dumps(entry.host)}", f"location = {json.dumps(entry.host)}",
                  f"insecure = {'true' if entry.insecure else 'false'}", ""]
        for mirror in entry.mirrors:
            lines += ["[[registry.mirror]]", f"location = {json.dumps(mirror)}",
                      f"insecure = {'true' if mirror in insecure else 'false'}", ""]
    return "\n".join(lines)


def auth_file(ref: Reference, auth: AuthConfig | None, hosts: Iterable[RegistryHost] = ()) -> dict[str, Any]:
    """The containers-auth.json document for pulling ``ref`` with ``auth``: an entry for the
    reference's registry and its mirrors (credentials whose ``server_address`` names another
    registry are not sent). Raises InvalidArgument for an ``auth`` that is not base64 ``user:password``."""
    auths: dict[str, Any] = {}
    if not auth:
        return {"auths": auths}
    if auth.server_address and registry_host(auth.server_address) != ref.domain:
        return {"auths": auths}
    username, password = auth.username, auth.password
    if auth.auth:
        try:
            decoded = base64.b64decode(auth.auth, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise InvalidArgument("the AuthConfig's auth is not base64 'username:password'") from None
        username, sep, password = decoded.partition(":")
        if not sep:
            raise InvalidArgument("the AuthConfig's auth is not base64 'username:password' (no ':')")
    entry: dict[str, str] = {}
    if auth.identity_token:
        # containers/image reads an identity token only beside an "auth" it can split at ':'.
        entry = {"auth": base64.b64encode(f"{username or '<token>'}:".encode()).decode(),
                 "identitytoken": auth.identity_token}
    elif username or password:
        entry = {"auth": base64.b64encode(f"{username}:{password}".encode()).decode()}
    if entry:
        mirrors = next((h.mirrors for h in hosts if h.host == ref.domain), ())
        for host in (ref.domain, *mirrors):
            auths[host] = entry
    return {"auths": auths}


_MESSAGE = re.compile(r'msg="((?:[^"\\]|\\.)*)"')
_DIGEST_MISMATCH = re.compile(r"[Dd]igest did not match, expected (sha256:[0-9a-f]{64}), got (sha256:[0-9a-f]{64})")
_BLOB = re.compile(r"blob (sha256:[0-9a-f]{64})")
#: containers/image's words for a manifest or config past its size bound ("reading config blob
#: sha256:...: exceeded maximum allowed size of 4194304 bytes").
_TOO_LARGE = re.compile(r"(?:reading (config blob sha256:[0-9a-f]{64}|manifest[^:]*): )?"
                        r"exceeded maximum allowed size of (\d+) bytes")


def _skopeo_message(stderr: str) -> str:
    """The message of skopeo's fatal log line (unquoted), else its last line."""
    found = _MESSAGE.findall(stderr)
    if found:
        message = found[-1].encode().decode("unicode_escape", errors="replace")
    else:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        message = lines[-1] if lines else "no error message"
    return message.removeprefix("Error parsing image name ").strip()


def _status(message: str, code: int) -> bool:
    """Whether ``message`` names the HTTP status ``code`` as a number of its own, not as digits of
    a digest or a port ("sha256:…401…" is no 401)."""
    return re.search(rf"(?<![0-9A-Za-z:.]){code}(?![0-9A-Za-z])", message) is not None


def skopeo_error(stderr: str, ref: Reference, *, credentials: bool = False) -> RpcError:
    """The error, one sentence with a status, that skopeo's ``stderr`` reports for pulling ``ref``
    (``credentials``: whether any were given)."""
    message = _skopeo_message(stderr)
    lower = message.lower()
    host = ref.domain
    mismatch = _DIGEST_MISMATCH.search(message)
    if mismatch:
        return DataLoss(f"image {ref}: blob {mismatch[1]} is corrupt or truncated: the registry sent content whose "
                        f"digest is {mismatch[2]}")
    too_large = _TOO_LARGE.search(message)
    if too_large:  # containers/image's bound on a manifest or config it reads whole
        what = (too_large[1] or "a manifest or config").replace(" blob", "")
        return InvalidArgument(f"image {ref}: {what} is larger than the {too_large[2]} bytes a pull takes")
    if "size mismatch" in lower or "unexpected eof" in lower:
        blob = _BLOB.search(message)
        what = f"blob {blob[1]}" if blob else "a blob"
        return DataLoss(f"image {ref}: {what} is truncated: {message}")
    if "unauthorized" in lower or "authentication required" in lower or _status(message, 401):
        if credentials:
            return Unauthenticated(f"unauthorized: {host} refused the credentials given for {ref}")
        return Unauthenticated(f"unauthorized: {host} wants credentials to pull {ref}; give credentials (CRI "
                               "AuthConfig: username and password, an identity token or a registry token)")
    if "denied" in lower or _status(message, 403):
        return PermissionDenied(f"access denied: {host} does not let these credentials pull {ref}, or the "
                                "repository does not exist")
    if "manifest unknown" in lower or "name unknown" in lower or "not found" in lower or _status(message, 404):
        blob = _BLOB.search(message)
        if blob and "manifest" not in lower:
            return NotFound(f"image {ref}: blob {blob[1]} not found in {host}: the registry lost it")
        return NotFound(f"image {ref} not found: {host} has no such repository, tag or digest")
    if "server gave http response to https client" in lower:
        return Unavailable(f"cannot pull {ref}: {host} speaks plain HTTP; mark it insecure in config.toml "
                           f"([registries.\"{host}\"] insecure = true) if that is intended")
    if "x509" in lower or "tls" in lower or "certificate" in lower:
        return Unavailable(f"cannot pull {ref}: the TLS connection to {host} failed: {message}")
    if "connection refused" in lower or "no such host" in lower or "dial tcp" in lower or "timeout" in lower:
        return Unavailable(f"cannot pull {ref}: {host} cannot be reached: {message}")
    return Unknown(f"pulling {ref} failed: {message}")


def select_platform(index: Mapping[str, Any], platform: Mapping[str, str], what: str) -> Descriptor:
    """The descriptor of ``platform``'s (os, architecture, variant) manifest in an index or
    manifest list, as containerd's platform matcher picks (a variant must match when both
    name one). Raises NotFound naming the platforms there are."""
    found = []
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        raise DataLoss(f"{what}: the index has no list of manifests")
    for entry in manifests:
        p = entry.get("platform") if isinstance(entry, dict) else None
        if not isinstance(p, dict):
            continue
        found.append(f"{p.get('os')}/{p.get('architecture')}" + (f"/{p['variant']}" if p.get("variant") else ""))
        if p.get("os") != platform["os"] or p.get("architecture") != platform["architecture"]:
            continue
        if p.get("variant") and platform.get("variant") and p["variant"] != platform["variant"]:
            continue
        return _descriptor(entry, what)
    wanted = f"{platform['os']}/{platform['architecture']}"
    raise NotFound(f"{what} has no image for {wanted} (it has: {', '.join(found) or 'none'})")


def _descriptor(entry: Any, what: str) -> Descriptor:
    if not isinstance(entry, dict):
        raise DataLoss(f"{what}: a descriptor is not an object")
    media_type, digest, size = entry.get("mediaType", ""), entry.get("digest"), entry.get("size")
    if not isinstance(digest, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise DataLoss(f"{what}: a descriptor has no valid digest and size")
    try:
        check_digest(digest)
    except ReferenceError as exc:
        raise DataLoss(f"{what}: {exc}") from None
    return Descriptor(str(media_type), digest, size)


def parse_manifest(data: bytes, what: str) -> tuple[str, dict[str, Any]]:
    """(media type, document) of a manifest or index. Raises DataLoss for one that is not JSON,
    InvalidArgument for a type a pull does not take (Docker schema 1)."""
    try:
        doc = decode_json(data, what)
    except ValueError as exc:
        raise DataLoss(str(exc)) from None
    if not isinstance(doc, dict):
        raise DataLoss(f"{what} is not a JSON object")
    media_type = doc.get("mediaType")
    if not media_type:  # OCI leaves it out; which one it is shows in its fields
        media_type = OCI_INDEX if "manifests" in doc else OCI_MANIFEST if "config" in doc else ""
    if doc.get("schemaVersion") == 1:
        raise InvalidArgument(f"{what} is a Docker schema 1 manifest, which podshim does not pull (it is "
                              "deprecated; push the image again with a current tool)")
    if media_type not in MEDIA_TYPES:
        raise InvalidArgument(f"{what} has the media type {media_type!r}, not an image manifest or index")
    return media_type, doc


def image_manifest(data: bytes, what: str) -> Manifest:
    """The :class:`Manifest` of one platform's manifest bytes. Raises DataLoss/InvalidArgument."""
    media_type, doc = parse_manifest(data, what)
    if media_type in _INDEXES:
        raise DataLoss(f"{what} is an index where an image manifest was expected")
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise DataLoss(f"{what} has no list of layers")
    return Manifest(media_type, _descriptor(doc.get("config"), what), tuple(_descriptor(d, what) for d in layers))


def _check_config_size(ref: Reference, manifest: Manifest) -> None:
    """InvalidArgument for a config larger than a pull takes, before it is downloaded."""
    if manifest.config.size > MAX_CONFIG_BYTES:
        raise InvalidArgument(f"image {ref}: its config {manifest.config.digest} is {manifest.config.size} bytes, "
                              f"more than the {MAX_CONFIG_BYTES} bytes an image config may have")


# -- the pull ------------------------------------------------------------------------------------

def _bytes_under(path: str) -> int:
    """The apparent size of the files under ``path``."""
    total = 0
    for entry in walk(path):
        if not entry.is_dir:
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass  # renamed or removed meanwhile
    return total


def _layout_blob(blobs: str, digest: str) -> str:
    """Where an OCI layout's blobs/sha256 directory ``blobs`` keeps the blob ``digest``."""
    return os.path.join(blobs, digest.partition(":")[2])


def _read_verified(path: str, digest: str) -> bytes | None:
    """The file at ``path`` if it is there and has the digest ``digest``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return data if sha256_digest(data) == digest else None


def _policy() -> bytes:
    # containerd verifies no signatures either; the host's policy.json is not ours to follow.
    return json.dumps({"default": [{"type": "insecureAcceptAnything"}]}).encode()


@dataclass(frozen=True)
class _Session:
    """One pull's skopeo command line start, environment and auth file."""

    ref: Reference
    auth: AuthConfig | None
    argv: list[str]
    env: dict[str, str]
    authfile: str

    def auth_args(self, prefix: str) -> list[str]:
        """skopeo's auth options (``--src-`` for copy, none for inspect)."""
        args = [f"--{prefix.lstrip('-')}authfile", self.authfile]
        if self.auth and self.auth.registry_token:
            # skopeo 1.9 takes a registry token on its command line only (containers-auth.json has no place for it)
            args += [f"--{prefix.lstrip('-')}registry-token", self.auth.registry_token]
        return args

    async def run(self, args: list[str], deadline: float) -> bytes:
        """skopeo ``args``' stdout; its failure as :func:`skopeo_error`'s error."""
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        returncode, out, err = await run_helper(self.argv + args, self.env, b"", remaining, f"pulling image {self.ref}")
        if returncode != 0:
            raise skopeo_error(err.decode(errors="replace"), self.ref, credentials=bool(self.auth))
        return out


class _Arrivals:
    """The blobs skopeo has finished in a layout's blobs directory, each hashed (and handed to
    ``stage``) in a worker thread as soon as it is there (see the module's docstring).

    ``verified`` maps a digest to the file that was hashed and matched it. ``stage(digest,
    path)`` is the caller's: it may fail (a config is no layer; the blob will be unpacked from
    the store then, and its error said), it must not keep ``path`` past its return.
    :meth:`aclose` waits for the workers: nothing of theirs runs once the pull is over.
    """

    def __init__(self, stage: Callable[[str, str], object] | None) -> None:
        self.stage = stage
        self.verified: dict[str, str] = {}
        self.skip: set[str] = set()  # digests not to stage (the config, once it is known)
        self.linked: dict[str, str] = {}  # digest -> layout path: stored blobs linked in (:meth:`seed`)
        self._seen: set[str] = set()
        self._futures: list[Future[None]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._pool = ThreadPoolExecutor(ARRIVAL_WORKERS, thread_name_prefix="pull-blob")

    async def follow(self, directory: str) -> None:
        """Look at ``directory`` until cancelled."""
        while True:
            self.scan(directory)
            await asyncio.sleep(ARRIVAL_POLL)

    def scan(self, directory: str) -> None:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(directory, name)
            if _BLOB_NAME.fullmatch(name) and path not in self._seen:
                self._seen.add(path)
                self._futures.append(self._pool.submit(self._arrived, "sha256:" + name, path))

    def restart(self) -> None:
        """Forget the files seen: the directory is made again (a second copy)."""
        self._seen.clear()
        self.linked.clear()
        with self._lock:
            self.verified.clear()

    def seed(self, directory: str, content: ContentStore, digests: Iterable[str]) -> None:
        """Hard-link the stored blobs ``digests`` into ``directory`` (a layout's blobs/sha256, on
        the store's filesystem) before skopeo runs: it then reuses them (containers/image's OCI
        destination takes a blob whose file is there) and downloads only the others. Linked
        blobs are not hashed or staged on arrival (the puller hashes those the image has); one that cannot be
        linked is simply downloaded."""
        os.makedirs(directory, 0o700, exist_ok=True)
        for digest in digests:
            path = _layout_blob(directory, digest)
            try:
                if not content.has(digest):  # a symbolic link in its place is not linked to: damage
                    continue
                os.link(content.path(digest), path)
            except (OSError, BlobError):
                continue  # not stored (any more), or no link here: downloaded
            self._seen.add(path)
            self.linked[digest] = path

    def verified_reuse(self, digest: str) -> None:
        """The linked blob ``digest`` was hashed and matched."""
        with self._lock:
            self.verified[digest] = self.linked[digest]

    def forget(self, digest: str) -> None:
        """The linked blob ``digest`` was damaged and is gone: its download is an arrival like any other."""
        path = self.linked.pop(digest)
        self._seen.discard(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _arrived(self, digest: str, path: str) -> None:
        if self._stopped.is_set():
            return
        try:
            if file_digest(path) != digest:
                return  # moving it in hashes it again and says what is wrong
        except OSError:
            return  # removed meanwhile (a second copy)
        with self._lock:
            self.verified[digest] = path
        if self.stage is not None and digest not in self.skip:
            try:
                self.stage(digest, path)
            except Exception as exc:  # noqa: BLE001 - unpacked again from the store, where its error counts
                log.debug("blob %s was not staged: %s", digest, exc)

    async def settle(self, directory: str) -> None:
        """Take what arrived last, and wait until every blob seen is hashed and staged."""
        self.scan(directory)
        if self._futures:
            await asyncio.wait([asyncio.wrap_future(f) for f in self._futures])

    async def aclose(self) -> None:
        """Stop: blobs not begun are not taken; wait for those under way (also when cancelled)."""
        self._stopped.set()
        for future in self._futures:
            future.cancel()
        running = [asyncio.wrap_future(f) for f in self._futures if not f.done()]
        cancelled = False
        while running:
            try:
                await asyncio.shield(asyncio.wait(running))
                break
            except asyncio.CancelledError:
                cancelled = True  # the threads cannot be stopped; what they write must not outlive us
                running = [f for f in running if not f.done()]
        self._pool.shutdown(wait=False)
        if cancelled:
            raise asyncio.CancelledError


class Puller:
    """Pulls images into ``content`` (see the module's docstring)."""

    def __init__(self, content: ContentStore, *, hosts: Iterable[RegistryHost] = (), timeout: float = PULL_TIMEOUT,
                 progress_timeout: float = PULL_PROGRESS_TIMEOUT, platform: Mapping[str, str] | None = None,
                 skopeo: str = SKOPEO) -> None:
        self.content = content
        self.hosts = tuple(hosts)
        self.timeout = timeout
        self.progress_timeout = progress_timeout
        if platform is None:
            from shim.sandbox.sandbox import host_platform
            platform = host_platform()
        self.platform = dict(platform)
        self.skopeo = skopeo
        self._pdeathsig = os.access(_SETPRIV, os.X_OK)

    async def pull(self, ref: Reference, auth: AuthConfig | None = None, *, stored: bool = False,
                   stage: Callable[[str, str], object] | None = None, reuse: Iterable[str] = (),
                   progress: Progress | None = None) -> Pulled:
        """Pull ``ref`` into the content store. Raises RpcError with a sentence (NotFound,
        Unauthenticated, DataLoss, Unavailable, DeadlineExceeded...); on any failure or
        cancellation nothing of this pull is left but blobs already verified.

        ``stage(digest, path)``, when given, is called in a worker thread for each blob
        downloaded, as soon as it is there and verified, while the rest download (the service
        unpacks layers with it); its failures are ignored (see :class:`_Arrivals`). All its
        calls have returned when this returns or raises.

        ``stored``: the node has an image by this reference already, so the manifest is read
        first and nothing is downloaded when its blobs are all stored. Otherwise the image is
        copied by the reference while the manifest is read (one skopeo start and round trip less
        on the way), and the copy is used only if it is the manifest read; else it is copied
        again by that digest (the tag moved meanwhile, or skopeo chose another platform).

        ``reuse``: digests of layer blobs in the store that skopeo may take instead of
        downloading them (hard-linked into its layout first; never manifests, which skopeo
        writes in place). Those the image has are hashed again before they count; a damaged one
        is removed from the store and downloaded (the store heals), and none is staged.

        ``progress``, when given, is filled in as the pull goes (:class:`Progress`).
        """
        work = self.content.temporary_dir("pull-")
        progress = progress or Progress()
        progress.work = work
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(loop.time() + self.progress_timeout) as stalled:
                watcher = asyncio.ensure_future(self._watch(work, stalled))
                arrivals = _Arrivals(stage)
                try:
                    return await self._pull(work, ref, auth, stored, arrivals, frozenset(reuse), progress)
                finally:
                    watcher.cancel()
                    await asyncio.wait([watcher])
                    await arrivals.aclose()
        except TimeoutError:
            raise DeadlineExceeded(f"pulling image {ref} made no progress for {self.progress_timeout:g} s "
                                   "(image_pull_progress_timeout); it was killed, and nothing of it was kept") from None
        except DeadlineExceeded:
            raise DeadlineExceeded(f"pulling image {ref} did not finish within {self.timeout:g} s "
                                   "(image_pull_timeout); it was killed, and nothing of it was kept") from None
        finally:
            remove_tree(work, ignore_errors=True)

    async def _watch(self, work: str, stalled: asyncio.Timeout) -> None:
        """Push ``stalled``'s deadline on while the bytes under ``work`` change, looked at in one
        walk. skopeo writes what it downloads there: the layout in image/, its temporary files in
        tmp/. The rest is small: the session's files in config/, written before skopeo starts,
        and, when skopeo does not run as root, its blob-info cache under .local/ (HOME is
        ``work``: .local/share/containers/cache), which changes only as skopeo records blobs."""
        loop = asyncio.get_running_loop()
        last = -1
        while True:
            await asyncio.sleep(min(self.progress_timeout / 4, 5.0))
            size = await asyncio.to_thread(_bytes_under, work)
            if size != last:
                last = size
                stalled.reschedule(loop.time() + self.progress_timeout)

    async def _pull(self, work: str, ref: Reference, auth: AuthConfig | None, stored: bool,
                    arrivals: _Arrivals, reuse: frozenset[str], progress: Progress) -> Pulled:
        early: asyncio.Task[bytes] | None = None
        follower = None
        checking: asyncio.Future[list[str]] | None = None  # the stored blobs linked in, hashed meanwhile
        try:
            deadline = asyncio.get_running_loop().time() + self.timeout
            session = self._prepare(work, ref, auth)
            layout = os.path.join(work, "image")
            blobs = os.path.join(layout, "blobs", "sha256")

            def copy(source: str, manifest: Manifest | None = None) -> list[str]:
                # An OCI image is copied as it is, byte for byte: skopeo would gzip its uncompressed
                # layers on their way into the layout otherwise, and they would not be the manifest's.
                # (A Docker schema 2 image is converted to OCI on the way, which this would refuse.)
                keep = ["--preserve-digests"] if manifest is not None and manifest.media_type == OCI_MANIFEST else []
                return ["copy", "--quiet", "--retry-times", "0", *keep, *session.auth_args("--src-"),
                        f"docker://{source}", f"oci:{layout}:image"]

            def inspect(source: str, *what: str) -> list[str]:
                return ["inspect", "--raw", *what, "--retry-times", "0", *session.auth_args(""), f"docker://{source}"]

            if not stored:
                arrivals.seed(blobs, self.content, reuse)
                early = asyncio.ensure_future(session.run(copy(str(ref)), deadline))
                follower = asyncio.ensure_future(arrivals.follow(blobs))
            raw = await session.run(inspect(str(ref)), deadline)
            repo_digest = sha256_digest(raw)
            if ref.digest is not None and repo_digest != ref.digest:
                raise DataLoss(f"image {ref}: the registry sent a manifest whose digest is {repo_digest}")
            media_type, doc = parse_manifest(raw, f"the manifest of {ref}")
            manifests = {repo_digest: raw}
            manifest_digest = repo_digest
            data: bytes | None = raw
            if media_type in _INDEXES:
                manifest_digest = select_platform(doc, self.platform, f"image {ref}").digest
                data = None  # this platform's manifest: from the copy, or asked for
            else:
                named = image_manifest(raw, f"the manifest of {ref}")
                progress.manifest(named)
                _check_config_size(ref, named)
                arrivals.skip.add(named.config.digest)
                if early is not None:  # its linked layers hashed while skopeo copies
                    checking = asyncio.ensure_future(self._check_reused(ref, named, arrivals))
            complete = None if early is not None else await asyncio.to_thread(self._complete, manifest_digest)
            if complete is not None:
                manifest, config = complete
                progress.manifest(manifest)
                config_doc = self._config(ref, manifest, config)
                await asyncio.to_thread(self._store_manifests, manifests)
            else:
                pinned = f"{ref.name}@{manifest_digest}"
                if early is not None:
                    await early
                    if checking is not None:
                        await checking  # a damaged one found is gone from the layout: copied again below
                    data = data or _read_verified(_layout_blob(blobs, manifest_digest), manifest_digest)
                if data is None:
                    data = await session.run(inspect(pinned), deadline)
                manifest = image_manifest(data, f"manifest {manifest_digest} of {ref}")
                progress.manifest(manifest)
                _check_config_size(ref, manifest)
                if sha256_digest(data) != manifest_digest:
                    raise DataLoss(f"image {ref}: manifest {manifest_digest} has the wrong content: its sha256 is "
                                   f"{sha256_digest(data)}")
                if early is None or not all(os.path.exists(_layout_blob(blobs, layer.digest))
                                            for layer in manifest.layers):
                    # Nothing copied yet (a stored image with blobs missing), or the copy is of
                    # another manifest (the tag moved meanwhile, or skopeo chose another platform),
                    # or skopeo compressed an uncompressed layer on its way (copied as it is now).
                    if follower is not None:
                        await arrivals.settle(blobs)
                    remove_tree(layout, ignore_errors=True)
                    arrivals.restart()
                    arrivals.seed(blobs, self.content, reuse)
                    follower = follower or asyncio.ensure_future(arrivals.follow(blobs))
                    await session.run(copy(pinned, manifest), deadline)
                await arrivals.settle(blobs)
                if await self._check_reused(ref, manifest, arrivals):
                    await session.run(copy(pinned, manifest), deadline)  # what was damaged, downloaded again
                    await arrivals.settle(blobs)
                layout_config = _read_verified(_layout_blob(blobs, manifest.config.digest), manifest.config.digest)
                if layout_config is None:
                    # The layout is OCI: skopeo converted a Docker schema 2 image, config included;
                    # the registry's own config is asked for (the layers are the registry's bytes).
                    layout_config = await session.run(inspect(pinned, "--config"), deadline)
                config_doc = self._config(ref, manifest, layout_config)  # nothing of a bad one is stored
                await asyncio.to_thread(self._store, ref, blobs, manifest, layout_config,
                                        {**manifests, manifest_digest: data}, dict(arrivals.verified))
            blob_digests = tuple(dict.fromkeys([repo_digest, manifest_digest, manifest.config.digest,
                                                *(layer.digest for layer in manifest.layers)]))
            return Pulled(ref, repo_digest, manifest_digest, manifest, config_doc, blob_digests)
        finally:
            if checking is not None:
                await asyncio.wait([checking])  # its threads hash files of the layout removed after us
                if not checking.cancelled():
                    checking.exception()  # retrieved: the pull's own error counts
            if follower is not None:
                follower.cancel()
                await asyncio.wait([follower])
            if early is not None:
                if not early.done():
                    early.cancel()  # its skopeo is killed with its group (client.processes.run)
                await asyncio.wait([early])
                if not early.cancelled():
                    early.exception()  # retrieved: the inspect's error, or the result, is what counts

    async def _check_reused(self, ref: Reference, manifest: Manifest, arrivals: _Arrivals) -> list[str]:
        """Hash the layout's files of ``manifest``'s layers that were linked from the store and
        are not verified yet (side by side, in threads): a damaged one is removed from the store
        (:meth:`ContentStore.check`) and from the layout, to be downloaded again. The damaged
        ones' digests."""
        linked = [digest for digest in dict.fromkeys(layer.digest for layer in manifest.layers)
                  if digest in arrivals.linked and digest not in arrivals.verified]
        intact = await asyncio.gather(*(asyncio.to_thread(self._intact, digest, arrivals.linked[digest])
                                        for digest in linked))
        damaged = [digest for digest, ok in zip(linked, intact) if not ok]
        for digest, ok in zip(linked, intact):
            if digest not in arrivals.linked:
                continue  # the layout was made again meanwhile (arrivals.restart)
            if ok:
                arrivals.verified_reuse(digest)
            else:
                arrivals.forget(digest)
        if damaged:
            log.warning("image %s: stored layer blobs %s were damaged; removed, downloading them again", ref,
                        ", ".join(damaged))
        return damaged

    def _intact(self, digest: str, path: str) -> bool:
        """Whether the layout's file ``path`` of the linked blob ``digest`` has that digest: the
        store's own blob is checked there (and removed when damaged); another file (skopeo
        downloaded it after all, or the store's blob was replaced meanwhile) is hashed."""
        try:
            if os.path.samestat(os.stat(path), os.stat(self.content.path(digest))):
                return self.content.check(digest)
        except FileNotFoundError:
            pass
        try:
            return file_digest(path) == digest
        except FileNotFoundError:
            return False

    def _prepare(self, work: str, ref: Reference, auth: AuthConfig | None) -> _Session:
        """Write this pull's registries.conf, policy and auth file (0600 in a 0700 directory)."""
        files = os.path.join(work, "config")
        ensure_private_dir(files, 0o700)
        paths = {}
        for name, data in (("registries.conf", registries_conf(self.hosts).encode()), ("policy.json", _policy()),
                           ("auth.json", json.dumps(auth_file(ref, auth, self.hosts)).encode())):
            paths[name] = os.path.join(files, name)
            fd = os.open(paths[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        tmp = os.path.join(work, "tmp")
        ensure_private_dir(tmp, 0o700)
        argv = [_SETPRIV, "--pdeathsig", "KILL", "--"] if self._pdeathsig else []
        argv += [self.skopeo, "--registries-conf", paths["registries.conf"], "--policy", paths["policy.json"],
                 "--tmpdir", tmp, "--override-os", self.platform["os"], "--override-arch", self.platform["architecture"]]
        if self.platform.get("variant"):
            argv += ["--override-variant", self.platform["variant"]]
        # Nothing of the daemon's environment: no ~/.docker/config.json, no system registries.conf.
        env = {"PATH": _PATH, "HOME": work, "XDG_CONFIG_HOME": files, "XDG_RUNTIME_DIR": files, "TMPDIR": tmp,
               "LANG": "C.UTF-8"}
        return _Session(ref, auth, argv, env, paths["auth.json"])

    def _complete(self, manifest_digest: str) -> tuple[Manifest, bytes] | None:
        """The manifest ``manifest_digest`` and its config's bytes if it and all its blobs are in
        the store already (the manifest and the config read back: one damaged on disk is removed,
        and the image is downloaded again)."""
        if not self.content.has(manifest_digest):
            return None
        try:
            manifest = image_manifest(self.content.read(manifest_digest), f"manifest {manifest_digest}")
            config = self.content.read(manifest.config.digest)
        except (RpcError, BlobError):
            return None
        return (manifest, config) if all(self.content.has(layer.digest) for layer in manifest.layers) else None

    def _store_manifests(self, manifests: Mapping[str, bytes]) -> None:
        for digest, data in manifests.items():
            self.content.add_bytes(data, digest)

    def _store(self, ref: Reference, blobs: str, manifest: Manifest, config: bytes, manifests: Mapping[str, bytes],
               verified: Mapping[str, str]) -> None:
        """Verify the layers skopeo wrote to the layout's ``blobs`` and move them into the content
        store, with the config and the manifests (a blob in ``verified``, digest to the file
        hashed on arrival, is not hashed again; skopeo fsynced each)."""
        try:
            self.content.add_bytes(config, manifest.config.digest)
        except BlobError as exc:
            raise DataLoss(f"image {ref}: the config {exc}") from None
        for layer in {layer.digest: layer for layer in manifest.layers}.values():  # each blob once
            path = _layout_blob(blobs, layer.digest)
            try:
                self.content.add_file(path, layer.digest, layer.size, verified=verified.get(layer.digest) == path,
                                      durable=True)
            except FileNotFoundError:
                raise DataLoss(f"image {ref}: blob {layer.digest} was not downloaded") from None
            except BlobError as exc:
                raise DataLoss(f"image {ref}: {exc}") from None
        self._store_manifests(manifests)
        self.content.sync()

    @staticmethod
    def _config(ref: Reference, manifest: Manifest, data: bytes) -> dict[str, Any]:
        """The image config ``data`` (its digest checked already) decoded and checked
        (:func:`.imageconfig.check_config`: a diff_id per layer). Raises InvalidArgument with a
        sentence naming what is wrong."""
        what = f"the config {manifest.config.digest} of {ref}"
        try:
            config = decode_json(data, what)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        return check_config(config, what, len(manifest.layers))
