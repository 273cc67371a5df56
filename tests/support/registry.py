"""A real OCI registry for the tests: Debian's ``docker-registry`` (distribution 2.8) on 127.0.0.1.

``running_registry()`` starts ``docker-registry serve CONFIG`` on a free loopback port with its
storage in a fresh temporary directory, plain HTTP, and returns once ``GET /v2/`` answers; at the
end of the block it stops the registry by pid (SIGTERM, then SIGKILL) and removes the directory,
also when the block raised. ``running_registry(auth=("user", "password"))`` is the same registry
behind htpasswd basic auth (a bcrypt line made with the C library's crypt(3)): ``/v2/`` answers
401 without those credentials.

The session fixtures ``registry`` and ``auth_registry`` give one of each to the whole run (a test
module's conftest imports them, tests/conftest.py does for every test): ``registry.host`` is
``127.0.0.1:PORT``, what an image reference starts with (``registry.ref("test/busybox:1.0")``).
Test images are built and pushed by tests/support/imagebuild.py.

Tests that need a broken registry can reach into its storage: ``Registry.blob_path(digest)`` is
the file distribution serves a blob from (truncate or overwrite it to serve a corrupt blob).
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import hashlib
import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

REGISTRY_BINARY = "docker-registry"
#: Seconds the registry may take to answer /v2/ (about 50 ms when idle).
START_TIMEOUT = 30.0
#: Seconds it may take to exit after SIGTERM (distribution drains its connections first).
STOP_TIMEOUT = 10.0
#: How often a start is tried with a new port when another process took the free port first.
START_ATTEMPTS = 3


@dataclass(frozen=True)
class Registry:
    """A running local registry."""

    host: str                            #: "127.0.0.1:PORT", the start of every reference to it
    directory: str                       #: its config, log and storage (removed when it stops)
    pid: int
    auth: tuple[str, str] | None = None  #: (username, password) when it wants basic auth

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def ref(self, name: str) -> str:
        """The full reference of ``name`` (``repo:tag`` or ``repo@digest``) in this registry."""
        return f"{self.host}/{name}"

    @property
    def storage(self) -> str:
        return os.path.join(self.directory, "storage")

    def blob_path(self, digest: str) -> str:
        """The file this registry serves the blob ``digest`` (``sha256:HEX``) from."""
        algorithm, hex_ = digest.split(":", 1)
        return os.path.join(self.storage, "docker", "registry", "v2", "blobs", algorithm, hex_[:2], hex_, "data")

    def skopeo_creds(self, option: str = "--creds") -> list[str]:
        """skopeo's credentials option for this registry (``--src-creds`` etc.); none without auth."""
        return [option, f"{self.auth[0]}:{self.auth[1]}"] if self.auth else []

    def log(self) -> str:
        with open(os.path.join(self.directory, "registry.log"), errors="replace") as f:
            return f.read()

    def blob_gets(self) -> list[str]:
        """The digests of the blobs the registry has served (GET /v2/.../blobs/...), in its access
        log's order."""
        return re.findall(r'"GET /v2/\S+/blobs/(sha256:[0-9a-f]{64}) HTTP/', self.log())

    def push_raw(self, name: str, config: bytes, layers: list[tuple[bytes, str]]) -> str:
        """Push an image as given, byte for byte, with no tool in between that would check it:
        ``config`` (any bytes) and ``layers`` ((blob, media type)) as blobs and an OCI manifest
        naming them, tagged ``name`` (``repo:tag``). Returns the reference to pull."""
        repo, _, tag = name.rpartition(":")
        descriptors = []
        for blob, media_type in [(config, "application/vnd.oci.image.config.v1+json"), *layers]:
            digest = "sha256:" + hashlib.sha256(blob).hexdigest()
            status, headers, body = self._request("POST", f"/v2/{repo}/blobs/uploads/")
            if status != 202:
                raise RuntimeError(f"the registry refused an upload ({status}): {body!r}")
            location = headers["location"]
            location = location.split(self.host, 1)[1] if self.host in location else location
            separator = "&" if "?" in location else "?"
            status, _, body = self._request("PUT", f"{location}{separator}digest={digest}", blob,
                                            {"Content-Type": "application/octet-stream"})
            if status != 201:
                raise RuntimeError(f"the registry refused blob {digest} ({status}): {body!r}")
            descriptors.append({"mediaType": media_type, "digest": digest, "size": len(blob)})
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": descriptors[0], "layers": descriptors[1:]}).encode()
        status, _, body = self._request("PUT", f"/v2/{repo}/manifests/{tag}", manifest,
                                        {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        if status != 201:
            raise RuntimeError(f"the registry refused the manifest ({status}): {body!r}")
        return self.ref(name)

    def _request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
                 ) -> tuple[int, dict[str, str], bytes]:
        host, port = self.host.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """``GET path`` on the registry (with its credentials, if any): status, headers, body."""
        headers = dict(headers or {})
        if self.auth:
            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            headers.setdefault("Authorization", f"Basic {token}")
        return _http_get(self.host, path, headers)


def _http_get(host: str, path: str, headers: dict[str, str], timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    name, port = host.rsplit(":", 1)
    connection = http.client.HTTPConnection(name, int(port), timeout=timeout)
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def bcrypt_hash(password: str) -> str:
    """A bcrypt hash (``$2b$…``) of ``password``, as htpasswd -B writes it, from libcrypt (libxcrypt).

    Python's own ``crypt`` module wraps the same function but is deprecated (gone in 3.13), and
    apache2-utils' htpasswd is not installed: calling crypt_gensalt/crypt directly needs neither.
    """
    name = ctypes.util.find_library("crypt")
    if name is None:
        raise RuntimeError("libcrypt (libcrypt1) is not installed: no bcrypt for the registry's htpasswd")
    libcrypt = ctypes.CDLL(name, use_errno=True)
    libcrypt.crypt_gensalt.restype = ctypes.c_char_p
    libcrypt.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
    libcrypt.crypt.restype = ctypes.c_char_p
    libcrypt.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    # Cost 5 (the minimum distribution's bcrypt accepts is 4): a test's login stays fast.
    salt = libcrypt.crypt_gensalt(b"$2b$", 5, None, 0)  # NULL random bytes: libcrypt reads the OS's
    if not salt:
        raise OSError(ctypes.get_errno(), "crypt_gensalt failed")
    hashed = libcrypt.crypt(password.encode(), salt)
    if not hashed or not hashed.startswith(b"$2b$"):
        raise OSError(ctypes.get_errno(), "crypt failed to make a bcrypt hash")
    text: str = hashed.decode()
    return text


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def registry_config(directory: str, address: str, htpasswd: str | None = None) -> str:
    """distribution's config: storage in ``directory``, plain HTTP on ``address`` (``HOST:PORT``),
    behind the basic-auth users of the file ``htpasswd`` when given (see :func:`write_htpasswd`)."""
    auth = (f"auth:\n  htpasswd:\n    realm: podshim-test\n    path: {htpasswd}\n") if htpasswd else ""
    return (
        "version: 0.1\n"
        "log:\n  level: info\n  formatter: text\n"
        f"storage:\n  filesystem:\n    rootdirectory: {os.path.join(directory, 'storage')}\n"
        "  delete:\n    enabled: true\n"
        "  maintenance:\n    uploadpurging:\n      enabled: false\n"
        f"http:\n  addr: {address}\n"
        + auth
    )


def write_htpasswd(path: str, auth: tuple[str, str]) -> str:
    """An htpasswd file at ``path`` with the one user ``auth`` (user, password); its path."""
    with open(path, "w") as f:
        f.write(f"{auth[0]}:{bcrypt_hash(auth[1])}\n")
    return path


@contextmanager
def running_registry(auth: tuple[str, str] | None = None) -> Iterator[Registry]:
    """Run a registry on 127.0.0.1 (behind basic auth with ``auth``) until the block ends.

    Raises RuntimeError with the registry's log when it exits or does not answer in time.
    """
    directory = tempfile.mkdtemp(prefix="podshim-registry-")
    try:
        htpasswd = write_htpasswd(os.path.join(directory, "htpasswd"), auth) if auth is not None else None
        for attempt in range(START_ATTEMPTS):
            port = _free_port()
            config = os.path.join(directory, "config.yml")
            with open(config, "w") as f:
                f.write(registry_config(directory, f"127.0.0.1:{port}", htpasswd))
            with open(os.path.join(directory, "registry.log"), "wb") as log:
                process = subprocess.Popen([REGISTRY_BINARY, "serve", config], stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            registry = Registry(f"127.0.0.1:{port}", directory, process.pid, auth)
            try:
                if _wait_serving(registry, process):
                    yield registry
                    return
                # It exited: another process took the port between our probe and its bind.
                if attempt + 1 == START_ATTEMPTS or "address already in use" not in registry.log():
                    raise RuntimeError(f"docker-registry exited with {process.returncode} before serving:\n"
                                       f"{registry.log()[-4000:]}")
            finally:
                _stop(process)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _wait_serving(registry: Registry, process: subprocess.Popen[bytes]) -> bool:
    """Poll ``GET /v2/`` until it answers 200 (or 401 behind auth): True; False if the registry exited.

    Between two refused connections this waits on the process's pidfd, so an exit ends the wait
    at once.
    """
    expected = 401 if registry.auth else 200
    pidfd = os.pidfd_open(process.pid)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                status, _, _ = _http_get(registry.host, "/v2/", {}, timeout=2.0)
            except OSError:
                status = None
            if status == expected:
                return True
            if status is not None:
                raise RuntimeError(f"the registry's /v2/ answered {status}, not {expected}:\n{registry.log()[-4000:]}")
            if select.select([pidfd], [], [], 0.02)[0]:
                process.wait()
                return False
        raise RuntimeError(f"the registry did not answer /v2/ within {START_TIMEOUT} s:\n{registry.log()[-4000:]}")
    finally:
        os.close(pidfd)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def registry() -> Iterator[Registry]:
    """The session's local registry: plain HTTP on 127.0.0.1, no auth."""
    with running_registry() as running:
        yield running


#: The credentials of the session's ``auth_registry``.
AUTH = ("podshim", "s3cret-pass")


@pytest.fixture(scope="session")
def auth_registry() -> Iterator[Registry]:
    """The session's local registry behind htpasswd basic auth (user and password: ``AUTH``)."""
    with running_registry(auth=AUTH) as running:
        yield running
