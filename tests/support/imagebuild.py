"""Test images, built offline and pushed to the tests' local registry (tests/support/registry.py).

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

import glob
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

import pytest

from shim.lib.files import flock_open

from support.registry import Registry

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


Layer = Sequence[Entry] | Mapping[str, bytes | str | Entry]


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
        modes: dict[str, int] = {}

        def add(info: tarfile.TarInfo, data: bytes | None = None) -> None:
            info.mtime = MTIME
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
            written.add(info.name)
            modes[info.name] = info.mode

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
                # A hard link's header carries its target's mode, as Docker writes it: containerd
                # applies the header's mode to the (shared) inode.
                info.type, info.linkname = tarfile.LNKTYPE, entry.target.strip("/")
                info.mode = modes.get(info.linkname, 0o644) if entry.mode is None else entry.mode
            elif entry.kind in ("file", "whiteout", "opaque"):
                data = entry.data if entry.kind == "file" else b""
                info.size, info.mode = len(data), 0o644 if entry.mode is None else entry.mode
            else:
                raise ValueError(f"unknown layer entry kind {entry.kind!r} for {entry.path!r}")
            add(info, data)
    return buffer.getvalue()


def busybox_layer(extra: Layer = (), busybox: str = BUSYBOX) -> list[Entry]:
    """A root filesystem: the ``busybox`` binary (busybox-static's by default; a dynamic one comes
    with the shared libraries it loads) with every applet hard-linked where ``busybox --list-full``
    puts it, the usual top-level directories, /etc/passwd and /etc/group (root and nobody), plus
    ``extra``."""
    with open(busybox, "rb") as f:
        binary = f.read()
    applets = subprocess.run([busybox, "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    out = [Entry(d, "dir") for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "home", "proc", "sys", "dev",
                                      "run", "var", "var/www", "usr/local/bin")]
    out += [Entry("tmp", "dir", mode=0o1777), Entry("root", "dir", mode=0o700)]
    out.append(Entry("bin/busybox", data=binary, mode=0o755))
    out += shared_libraries(busybox)
    # Hard links, as Docker Hub's busybox has them: masking one applet's path (critest's MaskedPaths
    # masks /bin/ls) then masks that path only, not the binary every symlink leads to.
    out += [Entry(a, "link", target="bin/busybox") for a in applets if a != "bin/busybox"]
    names = {a.rsplit("/", 1)[-1] for a in applets}
    out += [Entry(f"usr/bin/{name}", data=script, mode=0o755) for name, script in STAND_INS.items() if name not in names]
    out += [Entry("etc/passwd", data=BUSYBOX_PASSWD.encode()), Entry("etc/group", data=BUSYBOX_GROUP.encode())]
    return out + entries(extra)


def shared_libraries(binary: str) -> list[Entry]:
    """The shared libraries and the loader a dynamically linked ``binary`` needs, as files at the
    paths it loads them from (the node's own, as ldd finds them); none for a static one."""
    done = subprocess.run(["ldd", binary], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:  # "not a dynamic executable"
        return []
    out = []
    for line in done.stdout.splitlines():
        # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        path = line.split("=>")[-1].split("(")[0].strip()
        if path.startswith("/"):
            with open(path, "rb") as f:
                out.append(Entry(path.lstrip("/"), data=f.read(), mode=0o755))
    return out


#: Where Debian's dynamically linked busybox (the package ``busybox``) is unpacked for the tests,
#: once: ``<DYNAMIC_BUSYBOX_CACHE>/busybox-<version>/bin/busybox``.
DYNAMIC_BUSYBOX_CACHE = "/var/cache/podshim-test-images"


def dynamic_busybox() -> str:
    """The path of Debian's dynamically linked busybox, fetched with ``apt-get download busybox``
    and unpacked into DYNAMIC_BUSYBOX_CACHE on first use. Its shell runs every command it is given
    from PATH (busybox-static's prefers its own applets, so masking /bin/ls does not stop ``sh -c
    ls``). The package is never installed: it conflicts with busybox-static, which the other test
    images are made of. RuntimeError with apt's words when it cannot be fetched."""
    os.makedirs(DYNAMIC_BUSYBOX_CACHE, exist_ok=True)

    def unpacked() -> str | None:
        found = sorted(glob.glob(os.path.join(DYNAMIC_BUSYBOX_CACHE, "busybox-*", "bin", "busybox")))
        return found[-1] if found else None

    with flock_open(os.path.join(DYNAMIC_BUSYBOX_CACHE, "busybox.lock")):
        if (path := unpacked()) is not None:
            return path
        work = tempfile.mkdtemp(prefix=".busybox-", dir=DYNAMIC_BUSYBOX_CACHE)
        try:
            done = subprocess.run(["apt-get", "download", "busybox"], cwd=work, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=TOOL_TIMEOUT)
            debs = glob.glob(os.path.join(work, "busybox_*.deb"))
            if done.returncode != 0 or len(debs) != 1:
                raise RuntimeError(f"apt-get download busybox failed (exit status {done.returncode}): "
                                   f"{done.stderr.strip()} (critest's default image needs Debian's dynamic busybox)")
            version = _run(["dpkg-deb", "--field", debs[0], "Version"]).strip().replace(":", "_")
            _run(["dpkg-deb", "--extract", debs[0], os.path.join(work, "root")])
            os.rename(os.path.join(work, "root"), os.path.join(DYNAMIC_BUSYBOX_CACHE, f"busybox-{version}"))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        path = unpacked()
        assert path is not None
        return path


#: Applets critest's specs exec that Debian's busybox-static leaves out, as shell scripts.
STAND_INS = {
    # `ipcs -m`: the System V shared memory segments of this IPC namespace (HostIpc specs look for
    # the id of a segment made on the host).
    "ipcs": b"""#!/bin/sh
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch"
while read -r key shmid perms size cpid lpid nattch uid rest; do
    [ "$key" = key ] || echo "$key $shmid $uid $perms $size $nattch"
done < /proc/sysvipc/shm
""",
    # `pgrep PATTERN`: the pids of the processes whose name matches (status 1 when none does).
    "pgrep": b"""#!/bin/sh
[ $# -eq 1 ] || { echo "usage: pgrep PATTERN" >&2; exit 2; }
status=1
for d in /proc/[0-9]*; do
    read -r name 2>/dev/null < "$d/comm" || continue
    if [ "${d#/proc/}" != $$ ] && echo "$name" | grep -q -e "$1"; then
        echo "${d#/proc/}"
        status=0
    fi
done
exit $status
""",
}


#: /etc/passwd and /etc/group as the Docker Hub busybox image has them (critest's specs run as
#: "nobody" and read "www-data").
BUSYBOX_PASSWD = """\
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
"""
BUSYBOX_GROUP = """\
root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
lp:x:7:
mail:x:8:
kmem:x:9:
wheel:x:10:root
cdrom:x:11:
dialout:x:18:
floppy:x:19:
video:x:28:
audio:x:29:
tape:x:32:
www-data:x:33:
operator:x:37:
utmp:x:43:
users:x:100:
staff:x:50:
nogroup:x:65534:
"""


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
    source: str = ""     #: the tag in the builder's OCI layout it was pushed from
    format: str = "oci"  #: "oci" or "v2s2", as pushed

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


def _arguments_key(layers: Sequence[Layer], rest: object) -> str:
    """A digest of build arguments: entries by their data's digest (a bench layer holds megabytes)."""
    digest = hashlib.sha256(repr(rest).encode())
    for layer in layers:
        for entry in entries(layer):
            digest.update(repr(replace(entry, data=hashlib.sha256(entry.data).digest())).encode())
        digest.update(b"\0layer\0")
    return digest.hexdigest()


class TestImages:
    """The session's images in one registry (see the module's docstring)."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, registry: Registry, directory: str):
        self.registry = registry
        self.builder = ImageBuilder(directory)
        self._cache: dict[tuple[str, str], tuple[str, Image]] = {}  # (name, tag) -> (arguments, image)
        self.critest: CritestImages | None = None  # critest_images(self), once built
        config = self.builder.assemble("busybox", BUSYBOX_LAYERS, BUSYBOX_CONFIG)
        self.busybox = self._push("busybox", "test/busybox", "1.0", config)
        self._push("busybox", "test/busybox", "latest", config)
        self.busybox_v2s2 = self._push("busybox", "test/busybox-v2s2", "1.0", config, format="v2s2")
        self.builder.assemble("busybox-arm64", [busybox_layer({"arch": "arm64\n"})],
                                    replace(BUSYBOX_CONFIG, architecture="arm64"))
        self.builder.add_index("multiarch", {"linux/amd64": "busybox", "linux/arm64": "busybox-arm64"})
        index = self._push("multiarch", "test/multiarch", "1.0", config, all_images=True)
        self.multiarch = replace(index, platforms=self._platforms(index))

    def _push(self, tag: str, repo: str, dest_tag: str, config: ImageConfig, *, format: str = "oci",
              all_images: bool = False) -> Image:
        digest = self.builder.push(tag, self.registry, repo, dest_tag, format=format, all_images=all_images)
        return Image(self.registry, repo, dest_tag, digest, config, source=tag, format=format)

    def _platforms(self, index: Image) -> dict[str, str]:
        status, _, body = index.registry.get(f"/v2/{index.repo}/manifests/{index.digest}", {
            "Accept": "application/vnd.oci.image.index.v1+json"})
        if status != 200:
            raise RuntimeError(f"the registry has no index {index.by_digest} ({status})")
        return {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
                for m in json.loads(body)["manifests"]}

    def build(self, name: str, layers: Sequence[Layer] = (), config: ImageConfig = ImageConfig(), *,
              base: str | None = "busybox", tag: str = "1.0", format: str = "oci", repo: str | None = None,
              platforms: Sequence[str] = ()) -> Image:
        """Build and push ``test/NAME:TAG`` (or ``REPO:TAG``): ``base`` ("busybox", None for no layers
        at all, or the name of an image built before) plus ``layers``, with ``config`` over the
        base's. With ``platforms`` (say "linux/amd64", "linux/arm64") it is pushed as an OCI image
        index of that image for its own platform and, for each other one, the same layers under a
        config naming that platform (never run here). Cached: the same arguments give the same
        Image (a name rebuilt with other arguments is pushed again)."""
        key = _arguments_key(layers, (config, base, format, repo, tuple(platforms)))
        cached = self._cache.get((name, tag))
        if cached is not None and cached[0] == key:
            return cached[1]
        local = f"custom-{name}-{tag}"
        whole = self.builder.assemble(local, layers, config, base=self._local_tag(base))
        repo = repo or f"test/{name}"
        if platforms:
            members = {}
            for platform in platforms:
                os_, arch = platform.split("/")
                if (os_, arch) == (whole.os, whole.architecture):
                    members[platform] = local
                else:
                    other = f"{local}-{os_}-{arch}"
                    _run(["umoci", "tag", "--image", f"{self.builder.layout}:{local}", other])
                    _run(["umoci", "config", "--image", f"{self.builder.layout}:{other}", "--no-history",
                          "--os", os_, "--architecture", arch])
                    members[platform] = other
            self.builder.add_index(f"{local}-index", members)
            index = self._push(f"{local}-index", repo, tag, whole, format=format, all_images=True)
            image = replace(index, platforms=self._platforms(index))
        else:
            image = self._push(local, repo, tag, whole, format=format)
        self._cache[(name, tag)] = (key, image)
        return image

    def _local_tag(self, base: str | None) -> str | None:
        if base is None or base == "busybox":
            return base
        for (name, tag) in self._cache:
            if name == base:
                return f"custom-{name}-{tag}"
        raise ValueError(f"no image {base!r} was built in this session")

    def push(self, image: Image, registry: Registry, repo: str | None = None, tag: str | None = None) -> Image:
        """``image`` copied to another registry (or as another ``repo:tag`` in it; by default the same)."""
        repo, tag = repo or image.repo, tag or image.tag
        digest = self.builder.push(image.source, registry, repo, tag, format=image.format,
                                   all_images=bool(image.platforms))
        return replace(image, registry=registry, repo=repo, tag=tag, digest=digest)


@pytest.fixture(scope="session")
def test_images(registry: Registry) -> Iterator[TestImages]:
    """The session's test images, built and pushed to the session's ``registry`` on first use."""
    directory = tempfile.mkdtemp(prefix="podshim-images-")
    try:
        yield TestImages(registry, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- critest's images --------------------------------------------------------------------------------
#
# critest (cri-tools v1.37.0, pkg/validate/*.go and pkg/framework/*.go) pulls these images by these
# names; the layers and configs below give each what its specs check (images/*/Dockerfile and
# images/build in the cri-tools source say how upstream made them).
#
# How critest is pointed at them: the runtime under test mirrors the hosts critest names
# (registry.k8s.io, gcr.io, k8s.gcr.io) to the local registry over plain HTTP
# (CritestImages.mirrors); critest keeps its own default and web-server image names. Not
# --registry-prefix: for a fully qualified name critest then pulls PREFIX/PATH with the tag and
# digest dropped (reference.Path) and still asks ImageStatus under the gcr.io name, so every Image
# Manager spec fails on any runtime that way.

STAGING = "gcr.io/k8s-staging-cri-tools"
#: Upstream builds these as manifest lists: so do we (linux/amd64 + a fake linux/arm64).
INDEX_PLATFORMS = ("linux/amd64", "linux/arm64")

#: A busybox httpd in the foreground that a SIGTERM ends at once, also as its PID namespace's init
#: (where a signal without a handler does nothing): "serve-http PORT DIR".
SERVE_HTTP = b"""#!/bin/sh
trap 'kill $pid 2>/dev/null; exit 0' TERM INT QUIT
httpd -f -p "$1" -h "$2" &
pid=$!
wait $pid
"""

#: Docker Hub's httpd image runs httpd-foreground; Apache logs "Command line: 'httpd -D FOREGROUND'",
#: which the Multiple Containers log spec looks for in the container's log.
HTTPD_FOREGROUND = b"""#!/bin/sh
echo "AH00094: Command line: 'httpd -D FOREGROUND' (busybox httpd, /usr/local/apache2/htdocs, port 80)" >&2
exec /usr/local/bin/serve-http 80 /usr/local/apache2/htdocs
"""

#: Stands in for nginx in critest's PID-namespace specs: this process's comm is "nginx" (the
#: script's name; `pidof nginx` finds it), its command line says "master process" (what the specs
#: grep /proc/1/cmdline for), it writes its pid to /var/run/nginx.pid, and it serves port 80.
FAKE_NGINX = b"""#!/bin/sh
echo $$ > /var/run/nginx.pid
trap 'kill $pid 2>/dev/null; exit 0' TERM INT QUIT
httpd -f -p 80 -h /usr/share/nginx/html &
pid=$!
wait $pid
"""

#: Kubernetes' e2e "nonewprivs" image prints its effective uid from a setuid-root binary: with
#: no_new_privs the setuid bit is ignored ("Effective uid: 1000"), without it the uid is 0. busybox
#: drops a setuid bit itself, so this is a libc-free C program built with gcc.
NNP_C = r"""
static long sys3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile ("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
void _start(void) {
    char out[32] = "Effective uid: ";
    char digits[12];
    unsigned long uid = (unsigned long)sys3(107, 0, 0, 0);  /* geteuid */
    int n = 0, len = 15;
    do { digits[n++] = (char)('0' + uid % 10); uid /= 10; } while (uid);
    while (n) out[len++] = digits[--n];
    out[len++] = '\n';
    sys3(1, 1, (long)out, len);  /* write(1, out, len) */
    sys3(60, 0, 0, 0);           /* exit(0) */
    for (;;) {}
}
"""


def compiled(directory: str, name: str, source_text: str, flags: Sequence[str], what: str) -> bytes:
    """The program ``source_text`` (C) compiled by gcc with ``flags`` in ``directory``, as bytes."""
    source, binary = os.path.join(directory, f"{name}.c"), os.path.join(directory, name)
    with open(source, "w") as f:
        f.write(source_text)
    try:
        _run(["gcc", *flags, "-o", binary, source])
    except FileNotFoundError:
        raise RuntimeError(f"gcc is not installed: it builds {what} (.ci/install --test)") from None
    with open(binary, "rb") as f:
        data = f.read()
    os.unlink(source)
    os.unlink(binary)
    return data


def nnp_binary(directory: str) -> bytes:
    """The nonewprivs program, compiled (static, no libc, x86-64) in ``directory``."""
    return compiled(directory, "nnp", NNP_C, ["-static", "-nostdlib", "-Os", "-fno-stack-protector", "-fno-builtin",
                                              "-fno-asynchronous-unwind-tables", "-Wl,--build-id=none", "-s"],
                    "the nonewprivs test image")


#: A pause that is not catatonit (nothing may assume catatonit): it blocks in pause(), reaps its
#: children on SIGCHLD and exits 0 on SIGTERM or SIGINT. Built static with libc (libc6-dev's libc.a).
TINY_PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void on_term(int sig) { (void)sig; _exit(0); }
static void on_chld(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, 0);
    sigaction(SIGINT, &sa, 0);
    sa.sa_handler = on_chld;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, 0);
    for (;;) pause();
}
"""
CATATONIT = "/usr/bin/catatonit"


def tiny_pause_binary(directory: str) -> bytes:
    """The tiny C pause (TINY_PAUSE_C), compiled static (with libc.a) in ``directory``."""
    return compiled(directory, "tiny-pause", TINY_PAUSE_C, ["-static", "-Os", "-s"], "the tiny pause test image")


def catatonit_pause_image(images: TestImages) -> Image:
    """``test/pause-catatonit:1.0``: the static /usr/bin/catatonit as /catatonit, Entrypoint
    ["/catatonit", "-P"], nothing else in it (as registry.k8s.io/pause is a lone binary)."""
    with open(CATATONIT, "rb") as f:
        data = f.read()
    return images.build("pause-catatonit", [{"catatonit": Entry("", data=data, mode=0o755)}],
                        ImageConfig(entrypoint=("/catatonit", "-P"), env=(DEFAULT_PATH,)), base=None)


def tiny_pause_image(images: TestImages) -> Image:
    """``test/pause-tiny:1.0``: the tiny C pause as /bin/tiny-pause, Entrypoint ["tiny-pause"]
    (found in PATH), Cmd ["--pod"] (ignored by it, and shows that Cmd is appended), WorkingDir /bin,
    User 65534:65534 (it needs no privilege)."""
    data = tiny_pause_binary(images.builder.directory)  # compiled() removes its files
    return images.build("pause-tiny", [{"bin/tiny-pause": Entry("", data=data, mode=0o755)}],
                        ImageConfig(entrypoint=("tiny-pause",), cmd=("--pod",), env=(DEFAULT_PATH, "PAUSE=tiny"),
                                    working_dir="/bin", user="65534:65534"), base=None)


def web_root(directory: str, page: str) -> dict[str, bytes | str | Entry]:
    return {f"{directory}/index.html": page, "usr/local/bin/serve-http": Entry("", data=SERVE_HTTP, mode=0o755)}


@dataclass(frozen=True)
class CritestImages:
    """Every image critest pulls, in one local registry, and how to point a runtime at them."""

    registry: Registry
    default_image: str               #: critest's default test container image (its name for it)
    web_server_image: str            #: critest's web server image (its name for it)
    pulls: tuple[str, ...]           #: every reference critest's specs pull, as critest names them
    unavailable: Mapping[str, str]   #: references no local registry can serve, and why
    mirrors: Mapping[str, str]       #: registry host -> endpoint the runtime must use for it

    def local(self, reference: str) -> str:
        """Where ``reference`` (as critest names it) is in the local registry."""
        host, _, rest = reference.partition("/")
        if "." not in host and ":" not in host and host != "localhost":
            host, rest = "docker.io", reference
        if host == "docker.io" and "/" not in rest.split(":")[0].split("@")[0]:
            rest = f"library/{rest}"
        return reference if host == self.registry.host else f"{self.registry.host}/{rest}"

    def podshim_registry_config(self) -> str:
        """podshimd's config.toml registries for these mirrors (each mirrored host, then plain HTTP)."""
        config, insecure = "", set()
        for host, endpoint in self.mirrors.items():
            local = endpoint.removeprefix("http://")
            insecure.add(local)
            if host != local:
                config += f'[registries."{host}"]\nmirrors = ["{local}"]\n'
        return config + "".join(f'[registries."{h}"]\ninsecure = true\n' for h in sorted(insecure))

    def containerd_registry_config(self) -> str:
        """containerd 1.6's CRI config for these mirrors (TOML)."""
        return "".join(f'[plugins."io.containerd.grpc.v1.cri".registry.mirrors."{host}"]\n'
                       f'  endpoint = ["{endpoint}"]\n' for host, endpoint in self.mirrors.items())


#: critest's own names for its default, web-server, multi-container, and pause images.
E2E = "registry.k8s.io/e2e-test-images"
CRITEST_DEFAULT_IMAGE = f"{E2E}/busybox:1.29-2"
CRITEST_WEB_SERVER_IMAGE = f"{E2E}/nginx:1.14-2"  # also the Security Context specs' nginx
CRITEST_PAUSE_IMAGES = ("registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9")  # one image, two registries


def critest_images(images: TestImages) -> CritestImages:
    """Build and push every image critest pulls to ``images``' registry (once per TestImages)."""
    if images.critest is not None:
        return images.critest
    registry = images.registry
    endpoint = f"http://{registry.host}"
    critest = CritestImages(
        registry=registry, default_image=CRITEST_DEFAULT_IMAGE, web_server_image=CRITEST_WEB_SERVER_IMAGE,
        pulls=(), unavailable={}, mirrors={"registry.k8s.io": endpoint, "gcr.io": endpoint, "k8s.gcr.io": endpoint,
                                           registry.host: endpoint})
    staging = STAGING.partition("/")[2]  # "k8s-staging-cri-tools", the path under the mirrored gcr.io
    pulls: list[str] = []  # as critest names them

    def add(reference: str, image: Image) -> None:
        assert critest.local(reference) == image.ref, (reference, image.ref)  # the mirror leads to it
        pulls.append(reference)

    def e2e(reference: str) -> tuple[str, str]:
        """The repository and tag of an image critest names, in the local registry."""
        repo, _, tag = critest.local(reference).partition("/")[2].rpartition(":")
        return repo, tag

    # The default container image (e2e busybox upstream): sh and the applets the specs exec (echo,
    # sleep, top, ls, id, ipcs, ping, pgrep, pidof, hostname, netstat, brctl, mount, touch, cat,
    # grep, chmod), /etc/passwd with nobody (RunAsUserName). Debian's dynamic busybox: its sh execs
    # /bin/ls, which the MaskedPaths spec masks and expects `sh -c ls` to fail on.
    repo, tag = e2e(CRITEST_DEFAULT_IMAGE)
    default = images.build("critest-busybox", [busybox_layer(busybox=dynamic_busybox())], BUSYBOX_CONFIG,
                           base=None, repo=repo, tag=tag, format="v2s2")
    add(CRITEST_DEFAULT_IMAGE, default)
    # The web server of the Networking and Streaming specs and the nginx of the Security Context
    # PID specs: one name in critest. This process's comm is "nginx", its command line says
    # "master process", it serves GET / on port 80 (FAKE_NGINX).
    repo, tag = e2e(CRITEST_WEB_SERVER_IMAGE)
    nginx = images.build("critest-nginx", [{**web_root("usr/share/nginx/html", "<h1>podshim critest nginx</h1>\n"),
                                            "usr/sbin/nginx": Entry("", data=FAKE_NGINX, mode=0o755),
                                            "var/run": Entry("", "dir")}],
                         ImageConfig(cmd=("/usr/sbin/nginx", "nginx: master process nginx -g daemon off;"),
                                     exposed_ports=("80/tcp",), stop_signal="SIGQUIT"),
                         repo=repo, tag=tag, format="v2s2")
    add(CRITEST_WEB_SERVER_IMAGE, nginx)
    # "httpd" (Multiple Containers): serves port 80, has echo, and logs Apache's command line.
    reference = f"{E2E}/httpd:2.4.39-4"
    repo, tag = e2e(reference)
    httpd = images.build("critest-httpd", [{
        **web_root("usr/local/apache2/htdocs", "<html><body><h1>It works!</h1></body></html>\n"),
        "usr/local/bin/httpd-foreground": Entry("", data=HTTPD_FOREGROUND, mode=0o755)}],
                         ImageConfig(cmd=("httpd-foreground",), exposed_ports=("80/tcp",)),
                         repo=repo, tag=tag, format="v2s2")
    add(reference, httpd)
    # nonewprivs (Security Context: NoNewPrivs): a setuid-root program.
    reference = f"{E2E}/nonewprivs:1.3"
    repo, tag = e2e(reference)
    nnp = images.build("critest-nonewprivs",
                       [{"usr/local/bin/nnp": Entry("", data=nnp_binary(images.builder.directory), mode=0o4755)}],
                       ImageConfig(entrypoint=("/usr/local/bin/nnp",)), repo=repo, tag=tag, format="v2s2")
    add(reference, nnp)
    # pause:3.9 from two registries (Image Manager, Image Identifier Consistency): one image, run
    # with its own entrypoint; both names lead to the same local reference.
    repo, tag = e2e(CRITEST_PAUSE_IMAGES[0])
    pause = images.build("critest-pause", [{"pause": Entry("", data=tiny_pause_binary(images.builder.directory),
                                                            mode=0o755)}],
                         ImageConfig(entrypoint=("/pause",)), base=None, repo=repo, tag=tag, format="v2s2")
    for reference in CRITEST_PAUSE_IMAGES:
        add(reference, pause)
    # gcr.io/k8s-staging-cri-tools/*: manifest lists, as upstream's images/build makes them.
    hostnet = images.build("critest-hostnet-nginx", [web_root("usr/share/nginx/html", "<h1>hostnet</h1>\n")],
                           ImageConfig(cmd=("/usr/local/bin/serve-http", "12003", "/usr/share/nginx/html"),
                                       exposed_ports=("12003/tcp",)),
                           repo=f"{staging}/hostnet-nginx-amd64", tag="latest", platforms=INDEX_PLATFORMS)
    add(f"{STAGING}/hostnet-nginx-amd64:latest", hostnet)
    for name, user in (("test-image-user-uid", "1002"), ("test-image-user-username", "www-data"),
                       ("test-image-user-uid-group", "1003:1004"), ("test-image-user-username-group", "www-data:1004")):
        add(f"{STAGING}/{name}:latest", images.build(f"critest-{name}", [], ImageConfig(user=user),
                                                     repo=f"{staging}/{name}", tag="latest",
                                                     platforms=INDEX_PLATFORMS))
    # default-user (1000) in group-defined-in-image (50000), USER 1000: `adduser -u 1000 -D
    # default-user; addgroup -g 50000 group-defined-in-image; addgroup default-user group-...`.
    predefined = images.build("critest-predefined-group", [{
        "etc/passwd": BUSYBOX_PASSWD + "default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n",
        "etc/group": BUSYBOX_GROUP + "default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n",
        "home/default-user": Entry("", "dir", uid=1000, gid=1000)}],
        ImageConfig(user="1000"), repo=f"{staging}/test-image-predefined-group", tag="latest",
        platforms=INDEX_PLATFORMS)
    add(f"{STAGING}/test-image-predefined-group:latest", predefined)
    # image-test: busybox plus an empty file named for the image ("ADD ${TEST} ${TEST}").
    for name in ("test-image-1", "test-image-2", "test-image-3", "test-image-latest"):
        add(f"{STAGING}/{name}:latest", images.build(f"critest-{name}", [{name: ""}], repo=f"{staging}/{name}",
                                                     tag="latest", platforms=INDEX_PLATFORMS))
    # test-image-tags:1/2/3 are one image (file "same-image"); test-image-tag:test and :all are two.
    same = images.build("critest-test-image-tags", [{"same-image": ""}], repo=f"{staging}/test-image-tags",
                        tag="1", platforms=INDEX_PLATFORMS)
    add(f"{STAGING}/test-image-tags:1", same)
    for tag in ("2", "3"):
        add(f"{STAGING}/test-image-tags:{tag}", images.push(same, registry, tag=tag))
    for tag in ("test", "all"):
        add(f"{STAGING}/test-image-tag:{tag}", images.build(f"critest-test-image-tag-{tag}", [{tag: ""}],
                                                            repo=f"{staging}/test-image-tag", tag=tag,
                                                            platforms=INDEX_PLATFORMS))
    digest_ref = (f"{STAGING}/test-image-digest@sha256:"
                  "9700f9a2f5bf2c45f2f605a0bd3bce7cf37420ec9d3ed50ac2758413308766bf")
    images.critest = replace(critest, pulls=tuple(pulls), unavailable={
        digest_ref: "upstream's digest: a manifest with it needs upstream's exact config and layer blobs, which "
                    "cannot be built offline (the \"public image with digest\" spec fails on every runtime here)"})
    return images.critest


@pytest.fixture(scope="session")
def critest_image_set(test_images: TestImages) -> CritestImages:
    """Every image critest pulls, in the session's registry (built on first use)."""
    return critest_images(test_images)
