"""A demo image for a node without a registry: built from this machine's own programs, served by a
read-only registry on loopback for the quickstart's podshimd to pull.

    python3 examples/demo_registry.py [--port 0] [PROGRAM ...]

The image holds the programs named (default: sh, cat, hostname, ip, sleep) with the shared
libraries `ldd` names for them, each at its path on this machine, symbolic links on the way kept as
they are (so /bin/sh works on a merged /usr). It is served as `podshim-demo:1` over plain HTTP (the
registry API's GETs and HEADs: /v2/, manifests by tag or digest, blobs by digest) until the process
gets SIGTERM or SIGINT. The first line on stdout is the image's reference, `127.0.0.1:PORT/podshim-demo:1`.
Standard library only: it runs with the system's python3.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPOSITORY, TAG = "podshim-demo", "1"
DEFAULT_PROGRAMS = ("sh", "cat", "hostname", "ip", "sleep")
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
_LIBRARY = re.compile(r"(/\S+)\s+\(0x[0-9a-f]+\)$|=>\s+(/\S+)\s+\(0x[0-9a-f]+\)$")


def needed_files(programs: list[str]) -> list[str]:
    """The programs' paths on PATH and the shared libraries (and loader) ldd names for them."""
    paths: list[str] = []
    for name in programs:
        path = shutil.which(name)
        if path is None:
            raise SystemExit(f"demo_registry: no {name} on PATH")
        paths.append(path)
        done = subprocess.run(["ldd", path], capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines():  # "not a dynamic executable" (static) names none
            match = _LIBRARY.search(line.strip())
            if match:
                paths.append(match.group(1) or match.group(2))
    return list(dict.fromkeys(paths))


class Layer:
    """A tar of host paths, each with the symbolic links and directories on its way."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buffer, mode="w", format=tarfile.PAX_FORMAT)
        self.added: set[str] = set()

    def add(self, path: str, depth: int = 0) -> None:
        if depth > 40:
            raise SystemExit(f"demo_registry: too many symbolic links resolving {path}")
        current = ""
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            current += "/" + part
            st = os.lstat(current)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(current)
                self._entry(current, tarfile.SYMTYPE, linkname=target)
                base = os.path.dirname(current) if not target.startswith("/") else ""
                rest = "/".join(parts[i + 1:])
                self.add(os.path.normpath(os.path.join(base or "/", target, rest)), depth + 1)
                return
            if stat.S_ISDIR(st.st_mode):
                self._entry(current, tarfile.DIRTYPE, mode=0o755)
            else:
                with open(current, "rb") as f:
                    self._entry(current, tarfile.REGTYPE, mode=stat.S_IMODE(st.st_mode), data=f.read())

    def _entry(self, path: str, kind: bytes, *, mode: int = 0o777, linkname: str = "", data: bytes = b"") -> None:
        if path in self.added:
            return
        self.added.add(path)
        info = tarfile.TarInfo(path.lstrip("/"))
        info.type, info.mode, info.linkname, info.size, info.mtime = kind, mode, linkname, len(data), 0
        self.tar.addfile(info, io.BytesIO(data) if data else None)

    def close(self) -> bytes:
        self.tar.close()
        return self.buffer.getvalue()


def build(programs: list[str]) -> tuple[dict[str, bytes], bytes]:
    """The image's blobs by digest, and its manifest."""
    layer = Layer()
    for path in needed_files(programs):
        layer.add(path)
    tar = layer.close()
    compressed = gzip.compress(tar, mtime=0)
    diff_id = "sha256:" + hashlib.sha256(tar).hexdigest()
    config = json.dumps({
        "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine),
        "os": "linux", "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["sh"]},
    }).encode()
    blobs = {"sha256:" + hashlib.sha256(b).hexdigest(): b for b in (compressed, config)}
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + hashlib.sha256(config).hexdigest(), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": "sha256:" + hashlib.sha256(compressed).hexdigest(), "size": len(compressed)}],
    }).encode()
    return blobs, manifest


def serve(port: int, blobs: dict[str, bytes], manifest: bytes) -> None:
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    prefix = f"/v2/{REPOSITORY}/"

    class Registry(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/v2", "/v2/"):
                self._send(200, b"{}", "application/json", body)
            elif path.startswith(prefix + "manifests/") and path[len(prefix) + 10:] in (TAG, manifest_digest):
                self._send(200, manifest, MANIFEST_TYPE, body, manifest_digest)
            elif path.startswith(prefix + "blobs/") and path[len(prefix) + 6:] in blobs:
                digest = path[len(prefix) + 6:]
                self._send(200, blobs[digest], "application/octet-stream", body, digest)
            else:
                self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN","message":"not here"}]}', "application/json", body)

        def _send(self, code: int, data: bytes, kind: str, body: bool, digest: str = "") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the quickstart prints what matters

    server = ThreadingHTTPServer(("127.0.0.1", port), Registry)
    signal.signal(signal.SIGTERM, _stop)
    print(f"127.0.0.1:{server.server_address[1]}/{REPOSITORY}:{TAG}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _stop(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="the loopback port (default: one the kernel picks)")
    parser.add_argument("programs", nargs="*", default=list(DEFAULT_PROGRAMS), metavar="PROGRAM")
    args = parser.parse_args()
    blobs, manifest = build(args.programs)
    serve(args.port, blobs, manifest)


if __name__ == "__main__":
    sys.exit(main())
