"""Test images, built offline and pushed to the tests' local registry (tests/registry.py).

Everything comes from this machine: the root filesystem is busybox-static's one binary
(``/bin/busybox``) with its applet symlinks, layers are tar archives this module writes (so a
layer can carry exactly the whiteouts and opaque directories a test wants), umoci assembles them
into an OCI image layout, and skopeo pushes from the layout to the registry (as an OCI image, or
converted to Docker's schema 2 with ``--format v2s2``).

The session fixture ``test_images`` (tests/conftest.py imports it) builds and pushes once per run:

- ``test_images.busybox``: ``REGISTRY/test/busybox:1.0`` (also ``:latest``), an OCI image of
  three layers, Cmd ``["sh"]``; its later layers whiteout a file and make a directory opaque, so
  an unpacked rootfs must look like ``BUSYBOX_ROOTFS_CHECKS`` says.
- ``test_images.busybox_v2s2``: the same image as Docker schema 2 (``test/busybox-v2s2:1.0``).
- ``test_images.multiarch``: an OCI image index ``test/multiarch:1.0`` with linux/amd64 (the
  busybox image) and a fake linux/arm64 image (a busybox layer plus ``/arch`` saying arm64,
  config architecture arm64; it never runs here). ``.platforms`` maps "linux/amd64" to that
  platform's manifest digest.
- ``test_images.build(name, layers=..., config=..., base=...)``: any image a test needs, pushed as
  ``test/NAME:TAG``; cached by its arguments for the session. Layers are lists of ``Entry``
  (file, dir, symlink, hard link, whiteout, opaque marker) or dicts of path → bytes/str/Entry.

Each image is an ``Image``: ``.ref`` (``host:port/repo:tag``), ``.digest`` (the manifest's, as
pushed), ``.by_digest`` (``host:port/repo@sha256:…``), ``.config`` (the ImageConfig given).
``push(image, other_registry)`` copies one to another registry (the auth registry, say).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Union

import pytest

from registry import Registry

BUSYBOX = "/bin/busybox"
#: Every entry of a layer gets this mtime (2026-01-01), so a layer's bytes depend only on its entries.
MTIME = 1767225600
#: Seconds a umoci or skopeo call may take (a push of the ~100 MB bench image is a few seconds).
TOOL_TIMEOUT = 300.0
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# -- layers -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One entry of a layer archive. ``kind``: "file", "dir", "symlink" (``target``), "link" (a
    hard link to ``target``, a path in the archive), "whiteout" (deletes ``path`` from the lower
    layers: ``.wh.NAME``) or "opaque" (``path`` is a directory whose lower contents are hidden:
    ``path/.wh..wh..opq``)."""

    path: str
    kind: str = "file"
    data: bytes = b""
    target: str = ""
    mode: int | None = None
    uid: int = 0
    gid: int = 0


Layer = Union[Sequence[Entry], Mapping[str, Union[bytes, str, Entry]]]


def entries(layer: Layer) -> list[Entry]:
    """A layer as a list of entries (a mapping's str values are UTF-8 file contents)."""
    if isinstance(layer, Mapping):
        out = []
        for path, value in layer.items():
            if isinstance(value, Entry):
                out.append(replace(value, path=path))
            else:
                out.append(Entry(path, data=value.encode() if isinstance(value, str) else value))
        return out
    return list(layer)


def layer_tar(layer: Layer) -> bytes:
    """The uncompressed tar archive of a layer, parent directories first where the layer names none."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        written: set[str] = set()

        def add(info: tarfile.TarInfo, data: bytes | None = None) -> None:
            info.mtime = MTIME
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
            written.add(info.name)

        def parents(path: str) -> None:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                directory = "/".join(parts[:i])
                if directory and directory not in written:
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    add(info)

        for entry in entries(layer):
            path = entry.path.strip("/")
            if entry.kind == "whiteout":
                head, _, name = path.rpartition("/")
                path = f"{head}/.wh.{name}" if head else f".wh.{name}"
            elif entry.kind == "opaque":
                parents(path + "/x")
                path = f"{path}/.wh..wh..opq"
            parents(path)
            info = tarfile.TarInfo(path)
            info.uid, info.gid = entry.uid, entry.gid
            data = None
            if entry.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755 if entry.mode is None else entry.mode
            elif entry.kind == "symlink":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.target, 0o777
            elif entry.kind == "link":
                info.type, info.linkname, info.mode = tarfile.LNKTYPE, entry.target.strip("/"), 0o644
            elif entry.kind in ("file", "whiteout", "opaque"):
                data = entry.data if entry.kind == "file" else b""
                info.size, info.mode = len(data), 0o644 if entry.mode is None else entry.mode
            else:
                raise ValueError(f"unknown layer entry kind {entry.kind!r} for {entry.path!r}")
            add(info, data)
    return buffer.getvalue()


def busybox_layer(extra: Layer = ()) -> list[Entry]:
    """A root filesystem: busybox with every applet symlinked where ``busybox --list-full`` puts it,
    the usual top-level directories, /etc/passwd and /etc/group (root and nobody), plus ``extra``."""
    with open(BUSYBOX, "rb") as f:
        binary = f.read()
    applets = subprocess.run([BUSYBOX, "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    out = [Entry(d, "dir") for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "home", "proc", "sys", "dev",
                                      "run", "var", "var/www", "usr/local/bin")]
    out += [Entry("tmp", "dir", mode=0o1777), Entry("root", "dir", mode=0o700)]
    out.append(Entry("bin/busybox", data=binary, mode=0o755))
    out += [Entry(a, "symlink", target="/bin/busybox") for a in applets if a != "bin/busybox"]
    out += [Entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n"),
            Entry("etc/group", data=b"root:x:0:\nnogroup:x:65534:\n")]
    return out + entries(extra)


# -- image configs -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config the tests set. None: inherit from the base image (as a
    Dockerfile does: setting ``entrypoint`` without ``cmd`` clears the base's Cmd)."""

    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    env: tuple[str, ...] | None = None          #: "KEY=value"; replaces the base's list
    working_dir: str | None = None
    user: str | None = None
    exposed_ports: tuple[str, ...] | None = None  #: "80/tcp"
    labels: tuple[tuple[str, str], ...] | None = None
    volumes: tuple[str, ...] | None = None
    stop_signal: str | None = None
    architecture: str = "amd64"
    os: str = "linux"

    def over(self, base: ImageConfig) -> ImageConfig:
        """This config with what it leaves unset taken from ``base``."""
        merged = {f: getattr(self, f) if getattr(self, f) is not None else getattr(base, f)
                  for f in ("entrypoint", "cmd", "env", "working_dir", "user", "exposed_ports", "labels", "volumes",
                            "stop_signal")}
        if self.entrypoint is not None and self.cmd is None:
            merged["cmd"] = None
        return ImageConfig(**merged, architecture=self.architecture, os=self.os)

    def umoci_args(self) -> list[str]:
        args = ["--architecture", self.architecture, "--os", self.os]
        for name, flag, values in (("config.entrypoint", "--config.entrypoint", self.entrypoint),
                                   ("config.cmd", "--config.cmd", self.cmd),
                                   ("config.env", "--config.env", self.env),
                                   ("config.exposedports", "--config.exposedports", self.exposed_ports),
                                   ("config.volume", "--config.volume", self.volumes),
                                   ("config.labels", "--config.label",
                                    [f"{k}={v}" for k, v in self.labels] if self.labels is not None else None)):
            args.append(f"--clear={name}")
            args += [f"{flag}={v}" for v in values or ()]
        for flag, value in (("--config.workingdir", self.working_dir), ("--config.user", self.user),
                            ("--config.stopsignal", self.stop_signal)):
            if value is not None:
                args.append(f"{flag}={value}")
        return args


BUSYBOX_CONFIG = ImageConfig(cmd=("sh",), env=(DEFAULT_PATH,))


# -- built images ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Image:
    """An image pushed to a registry."""

    registry: Registry
    repo: str      #: "test/busybox"
    tag: str
    digest: str    #: the manifest's (or the index's) digest, as the registry serves it
    config: ImageConfig = field(default_factory=ImageConfig)
    platforms: Mapping[str, str] = field(default_factory=dict)  #: "os/arch" -> manifest digest (an index)

    @property
    def ref(self) -> str:
        return f"{self.registry.host}/{self.repo}:{self.tag}"

    @property
    def by_digest(self) -> str:
        return f"{self.registry.host}/{self.repo}@{self.digest}"


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TOOL_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


class ImageBuilder:
    """An OCI image layout in ``directory`` where images are assembled by tag, and pushed from."""

    def __init__(self, directory: str):
        self.directory = directory
        self.layout = os.path.join(directory, "oci")
        self.configs: dict[str, ImageConfig] = {}
        _run(["umoci", "init", "--layout", self.layout])

    def assemble(self, tag: str, layers: Sequence[Layer], config: ImageConfig = ImageConfig(),
                 base: str | None = None) -> ImageConfig:
        """Make the layout's ``tag``: ``base``'s layers (a tag built before) or none, then ``layers``,
        then ``config`` over the base's. Returns the image's whole config."""
        image = f"{self.layout}:{tag}"
        if base is not None:
            _run(["umoci", "tag", "--image", f"{self.layout}:{base}", tag])
        else:
            _run(["umoci", "new", "--image", image])
        for number, layer in enumerate(layers):
            path = os.path.join(self.directory, f"{tag}-{number}.tar")
            with open(path, "wb") as f:
                f.write(layer_tar(layer))
            try:
                _run(["umoci", "raw", "add-layer", "--image", image, "--history.created_by",
                      f"podshim tests: layer {number} of {tag}", path])
            finally:
                os.unlink(path)
        whole = config.over(self.configs[base]) if base is not None else config
        _run(["umoci", "config", "--image", image, "--no-history", *whole.umoci_args()])
        self.configs[tag] = whole
        return whole

    def add_index(self, tag: str, platforms: Mapping[str, str]) -> None:
        """Make ``tag`` an OCI image index of the layout's tags ``platforms`` ("os/arch" -> tag)."""
        index_path = os.path.join(self.layout, "index.json")
        with open(index_path) as f:
            index = json.load(f)
        by_tag = {m.get("annotations", {}).get("org.opencontainers.image.ref.name"): m for m in index["manifests"]}
        manifests = []
        for platform, member in platforms.items():
            os_, arch = platform.split("/")
            descriptor = {k: by_tag[member][k] for k in ("mediaType", "digest", "size")}
            manifests.append({**descriptor, "platform": {"architecture": arch, "os": os_}})
        blob = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": manifests}, separators=(",", ":")).encode()
        digest = hashlib.sha256(blob).hexdigest()
        with open(os.path.join(self.layout, "blobs", "sha256", digest), "wb") as f:
            f.write(blob)
        index["manifests"] = [m for m in index["manifests"]
                              if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag]
        index["manifests"].append({"mediaType": "application/vnd.oci.image.index.v1+json", "digest": f"sha256:{digest}",
                                   "size": len(blob), "annotations": {"org.opencontainers.image.ref.name": tag}})
        with open(index_path + ".tmp", "w") as f:
            json.dump(index, f)
        os.replace(index_path + ".tmp", index_path)

    def push(self, tag: str, registry: Registry, repo: str, dest_tag: str, *, format: str = "oci",
             all_images: bool = False) -> str:
        """Copy the layout's ``tag`` to ``registry`` as ``repo:dest_tag`` (``format`` "oci" or
        "v2s2"; ``all_images`` for an index); the digest of the manifest the registry now serves."""
        digest_file = os.path.join(self.directory, "digest")
        _run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", *registry.skopeo_creds("--dest-creds"),
              "--format", format, "--digestfile", digest_file, *(["--all"] if all_images else []),
              f"oci:{self.layout}:{tag}", f"docker://{registry.ref(f'{repo}:{dest_tag}')}"])
        with open(digest_file) as f:
            return f.read().strip()


#: What an unpacked test/busybox rootfs holds (path -> bytes) and must not hold (path -> None),
#: after its second layer's whiteout (/podshim-test/removed) and opaque directory
#: (/podshim-test/opaque: only "new" is left of it) and its third layer's rewrite of "kept".
BUSYBOX_ROOTFS_CHECKS: dict[str, bytes | None] = {
    "podshim-test/kept": b"kept, rewritten by layer 3\n",
    "podshim-test/hardlink": b"hard-linked in layer 1\n",
    "podshim-test/removed": None,
    "podshim-test/opaque/old": None,
    "podshim-test/opaque/sub/deeper": None,
    "podshim-test/opaque/new": b"new in layer 2\n",
    "podshim-test/layer": b"3\n",
}

BUSYBOX_LAYERS: list[Layer] = [
    busybox_layer([Entry("podshim-test/kept", data=b"kept, from layer 1\n"),
                   Entry("podshim-test/removed", data=b"whited out by layer 2\n"),
                   Entry("podshim-test/linked", data=b"hard-linked in layer 1\n"),
                   Entry("podshim-test/hardlink", "link", target="podshim-test/linked"),
                   Entry("podshim-test/opaque/old", data=b"hidden by layer 2\n"),
                   Entry("podshim-test/opaque/sub/deeper", data=b"hidden by layer 2\n"),
                   Entry("podshim-test/layer", data=b"1\n")]),
    [Entry("podshim-test/removed", "whiteout"),
     Entry("podshim-test/opaque", "opaque"),
     Entry("podshim-test/opaque/new", data=b"new in layer 2\n"),
     Entry("podshim-test/layer", data=b"2\n")],
    {"podshim-test/kept": "kept, rewritten by layer 3\n", "podshim-test/layer": "3\n"},
]


class TestImages:
    """The session's images in one registry (see the module's docstring)."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, registry: Registry, directory: str):
        self.registry = registry
        self.builder = ImageBuilder(directory)
        self._cache: dict[tuple[str, str], tuple[str, Image]] = {}  # (name, tag) -> (arguments, image)
        config = self.builder.assemble("busybox", BUSYBOX_LAYERS, BUSYBOX_CONFIG)
        self.busybox = self._push("busybox", "test/busybox", "1.0", config)
        self._push("busybox", "test/busybox", "latest", config)
        self.busybox_v2s2 = self._push("busybox", "test/busybox-v2s2", "1.0", config, format="v2s2")
        self.builder.assemble("busybox-arm64", [busybox_layer({"arch": "arm64\n"})],
                                    replace(BUSYBOX_CONFIG, architecture="arm64"))
        self.builder.add_index("multiarch", {"linux/amd64": "busybox", "linux/arm64": "busybox-arm64"})
        index = self._push("multiarch", "test/multiarch", "1.0", config, all_images=True)
        self.multiarch = replace(index, platforms=self._platforms(index))

    def _push(self, tag: str, repo: str, dest_tag: str, config: ImageConfig, **kwargs: object) -> Image:
        digest = self.builder.push(tag, self.registry, repo, dest_tag, **kwargs)  # type: ignore[arg-type]
        return Image(self.registry, repo, dest_tag, digest, config)

    def _platforms(self, index: Image) -> dict[str, str]:
        status, _, body = self.registry.get(f"/v2/{index.repo}/manifests/{index.digest}", {
            "Accept": "application/vnd.oci.image.index.v1+json"})
        if status != 200:
            raise RuntimeError(f"the registry has no index {index.by_digest} ({status})")
        return {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
                for m in json.loads(body)["manifests"]}

    def build(self, name: str, layers: Sequence[Layer] = (), config: ImageConfig = ImageConfig(), *,
              base: str | None = "busybox", tag: str = "1.0", format: str = "oci") -> Image:
        """Build and push ``test/NAME:TAG``: ``base`` ("busybox", None for no layers at all, or the
        name of an image built before) plus ``layers``, with ``config`` over the base's. Cached:
        the same arguments give the same Image (a name rebuilt with other arguments is pushed again)."""
        key = repr((layers, config, base, format))
        cached = self._cache.get((name, tag))
        if cached is not None and cached[0] == key:
            return cached[1]
        local = f"custom-{name}-{tag}"
        whole = self.builder.assemble(local, layers, config, base=self._local_tag(base))
        image = self._push(local, f"test/{name}", tag, whole, format=format)
        self._cache[(name, tag)] = (key, image)
        return image

    def _local_tag(self, base: str | None) -> str | None:
        if base is None or base == "busybox":
            return base
        for (name, tag) in self._cache:
            if name == base:
                return f"custom-{name}-{tag}"
        raise ValueError(f"no image {base!r} was built in this session")

    def push(self, image: Image, registry: Registry) -> Image:
        """``image`` copied to another registry (same repo and tag)."""
        local = "busybox" if image.repo in ("test/busybox", "test/busybox-v2s2") else None
        if image.repo == "test/multiarch":
            local = "multiarch"
        elif local is None:
            local = f"custom-{image.repo.removeprefix('test/')}-{image.tag}"
        format = "v2s2" if image.repo == "test/busybox-v2s2" else "oci"
        digest = self.builder.push(local, registry, image.repo, image.tag, format=format,
                                   all_images=bool(image.platforms))
        return replace(image, registry=registry, digest=digest)


@pytest.fixture(scope="session")
def test_images(registry: Registry) -> Iterator[TestImages]:
    """The session's test images, built and pushed to the session's ``registry`` on first use."""
    directory = tempfile.mkdtemp(prefix="podshim-images-")
    try:
        yield TestImages(registry, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
