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
   layout's blobs side by side (up to 6) and a dir:'s one after another (docs/benchmarks.md). Its layers
   are used only if they are those of the manifest step 1 resolved; otherwise (the tag moved
   between the two, or skopeo chose another platform) it is copied again as ``NAME@DIGEST``,
   pinned to what step 1 saw. A layout is OCI, so skopeo converts a Docker schema 2 manifest and
   config on the way (the layers keep their bytes): the registry's own manifest is step 1's (or,
   for an index, asked for by digest when the layout lacks it), and the config is asked for with
   ``inspect --raw --config`` then.
3. Every blob is verified (size and sha256) and moved into the content store; the manifests too.

Steps 2 and 3 overlap, and with them the unpacking: :class:`.arrivals.Arrivals` watches the
layout's blobs directory and, as each finished blob appears, hashes it and hands it to the
caller's ``stage`` (the service unpacks it into a staging directory of the snapshotter) in a
worker thread, while the rest download. What was hashed is
moved in by a rename without hashing it again, and what skopeo fsynced is not fsynced again: one
directory fsync makes the renames durable.

Blobs that are already in the store are not downloaded again: for a reference the node has an
image of, step 1 runs first, and step 2 is skipped when its manifest and all its blobs are there
(the manifest and config read back and checked against their digests: one damaged on disk is
removed and downloaded again; a blob downloaded again replaces what the store had). For any other
image, the layer blobs of the images the node has are hard-linked into the fresh layout before
skopeo runs (same filesystem): containers/image's OCI destination takes a blob whose file is there
(``TryReusingBlob`` stats it), so only the blobs the node lacks are downloaded. The linked
layers the image has are hashed before they count; a damaged one is removed from the store and
from the layout, and downloaded by a second copy into the same layout. Linked blobs are not staged:
their layers are in committed snapshots already, or are unpacked from the store. Manifests are never
linked: skopeo writes a layout's manifest in place, through any link.

What skopeo is given (credentials in an auth file, a clean environment) and what its errors
mean is :mod:`.skopeo`'s; the OCI image model (manifests, indexes, descriptors) is :mod:`.manifests`'s.
A pull that overruns its timeout, or
downloads nothing for its progress timeout (a registry that stopped answering: containerd 1.7's
image_pull_progress_timeout), is killed with its process group (DeadlineExceeded).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shim.lib.files import decode_json, ensure_private_dir
from shim.lib.trees import remove_tree, walk
from shim.rpc.status import DataLoss, DeadlineExceeded, InvalidArgument, RpcError

from .arrivals import Arrivals, layout_blob
from .content import BlobError, ContentStore, file_digest, sha256_digest
from .imageconfig import MAX_CONFIG_BYTES, check_config
from .manifests import (
    INDEXES,
    MEDIA_TYPES,
    OCI_MANIFEST,
    Descriptor,
    Manifest,
    image_manifest,
    parse_manifest,
    select_platform,
)
from .reference import Reference
from .skopeo import (
    SETPRIV,
    SKOPEO,
    SKOPEO_PATH,
    AuthConfig,
    RegistryHost,
    Session,
    auth_file,
    policy,
    registries_conf,
    registry_host,
    skopeo_error,
)

__all__ = ["PULL_TIMEOUT", "PULL_PROGRESS_TIMEOUT", "SKOPEO", "MEDIA_TYPES", "AuthConfig", "RegistryHost", "Descriptor", "Manifest",
           "Progress", "Pulled",
           "Puller", "registries_conf", "auth_file", "skopeo_error", "select_platform", "parse_manifest",
           "registry_host"]

#: Seconds a whole pull (both skopeo runs) may take by default; config.toml's image_pull_timeout.
PULL_TIMEOUT = 3600.0
#: Seconds a pull may go without a byte downloaded before it is given up (containerd 1.7's
#: image_pull_progress_timeout, 5 min); config.toml's image_pull_progress_timeout.
PULL_PROGRESS_TIMEOUT = 300.0

log = logging.getLogger(__name__)


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


def _read_verified(path: str, digest: str) -> bytes | None:
    """The file at ``path`` if it is there and has the digest ``digest``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return data if sha256_digest(data) == digest else None


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
            from shim.lib.platform import host_platform
            platform = host_platform()
        self.platform = dict(platform)
        self.skopeo = skopeo
        self._pdeathsig = os.access(SETPRIV, os.X_OK)

    async def pull(self, ref: Reference, auth: AuthConfig | None = None, *, stored: bool = False,
                   stage: Callable[[str, str], object] | None = None, reuse: Iterable[str] = (),
                   progress: Progress | None = None) -> Pulled:
        """Pull ``ref`` into the content store. Raises RpcError with a sentence (NotFound,
        Unauthenticated, DataLoss, Unavailable, DeadlineExceeded...); on any failure or
        cancellation nothing of this pull is left but blobs already verified.

        ``stage(digest, path)``, when given, is called in a worker thread for each blob
        downloaded, as soon as it is there and verified, while the rest download (the service
        unpacks layers with it); its failures are ignored (see :class:`.arrivals.Arrivals`). All its
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
                arrivals = Arrivals(stage)
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
                    arrivals: Arrivals, reuse: frozenset[str], progress: Progress) -> Pulled:
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
            if media_type in INDEXES:
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
                    data = data or _read_verified(layout_blob(blobs, manifest_digest), manifest_digest)
                if data is None:
                    data = await session.run(inspect(pinned), deadline)
                manifest = image_manifest(data, f"manifest {manifest_digest} of {ref}")
                progress.manifest(manifest)
                _check_config_size(ref, manifest)
                if sha256_digest(data) != manifest_digest:
                    raise DataLoss(f"image {ref}: manifest {manifest_digest} has the wrong content: its sha256 is "
                                   f"{sha256_digest(data)}")
                if early is None or not all(os.path.exists(layout_blob(blobs, layer.digest))
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
                layout_config = _read_verified(layout_blob(blobs, manifest.config.digest), manifest.config.digest)
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

    async def _check_reused(self, ref: Reference, manifest: Manifest, arrivals: Arrivals) -> list[str]:
        """Hash the layout's files of ``manifest``'s layers that were linked from the store and
        are not verified yet (side by side, in threads): a damaged one is removed from the store
        (:meth:`ContentStore.check`) and from the layout, to be downloaded again. The damaged
        ones' digests."""
        linked = [digest for digest in dict.fromkeys(layer.digest for layer in manifest.layers)
                  if digest in arrivals.linked and digest not in arrivals.verified]
        intact = await asyncio.gather(*(asyncio.to_thread(self._intact, digest, arrivals.linked[digest])
                                        for digest in linked))
        damaged = [digest for digest, ok in zip(linked, intact, strict=False) if not ok]
        for digest, ok in zip(linked, intact, strict=False):
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

    def _prepare(self, work: str, ref: Reference, auth: AuthConfig | None) -> Session:
        """Write this pull's registries.conf, policy and auth file (0600 in a 0700 directory)."""
        files = os.path.join(work, "config")
        ensure_private_dir(files, 0o700)
        paths = {}
        for name, data in (("registries.conf", registries_conf(self.hosts).encode()), ("policy.json", policy()),
                           ("auth.json", json.dumps(auth_file(ref, auth, self.hosts)).encode())):
            paths[name] = os.path.join(files, name)
            fd = os.open(paths[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        tmp = os.path.join(work, "tmp")
        ensure_private_dir(tmp, 0o700)
        argv = [SETPRIV, "--pdeathsig", "KILL", "--"] if self._pdeathsig else []
        argv += [self.skopeo, "--registries-conf", paths["registries.conf"], "--policy", paths["policy.json"],
                 "--tmpdir", tmp, "--override-os", self.platform["os"], "--override-arch", self.platform["architecture"]]
        if self.platform.get("variant"):
            argv += ["--override-variant", self.platform["variant"]]
        # Nothing of the daemon's environment: no ~/.docker/config.json, no system registries.conf.
        env = {"PATH": SKOPEO_PATH, "HOME": work, "XDG_CONFIG_HOME": files, "XDG_RUNTIME_DIR": files, "TMPDIR": tmp,
               "LANG": "C.UTF-8"}
        return Session(ref, auth, argv, env, paths["auth.json"])

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
            path = layout_blob(blobs, layer.digest)
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
