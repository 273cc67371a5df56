"""Pulls from a registry behind bearer-token auth (Docker's token protocol): CRI's registry token,
identity token (an OAuth2 refresh token) and username/password, each through skopeo.

The registry is the session's real docker-registry behind a small front (``TokenFront``) that
answers 401 with ``WWW-Authenticate: Bearer realm=...`` unless a request carries the one access
token, hands that token out at its realm for the right basic credentials (GET) or the right
refresh token (POST, grant_type=refresh_token), and passes authorised requests through.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import secrets
import threading
import urllib.parse
from collections.abc import Iterator

import pytest

from shim.rpc.status import Unauthenticated

from client.images.service import Images
from client.images.skopeo import AuthConfig, RegistryHost

USER, PASSWORD = "tokenuser", "token-pass"


class TokenFront(http.server.ThreadingHTTPServer):
    """The token-auth front of ``upstream`` (host:port of a plain registry)."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream
        self.access_token = secrets.token_hex(16)
        self.refresh_token = secrets.token_hex(16)
        self.seen: list[str] = []  # the /v2/ paths asked for with the access token

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: TokenFront
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._serve(head=False)

    def do_HEAD(self) -> None:  # noqa: N802  (http.server names the method)
        self._serve(head=True)

    def do_POST(self) -> None:  # noqa: N802  (http.server names the method)
        form = urllib.parse.parse_qs(self._body().decode())
        if (self.path.startswith("/token") and form.get("grant_type") == ["refresh_token"]
                and form.get("refresh_token") == [self.server.refresh_token]):
            self._json(200, {"access_token": self.server.access_token, "expires_in": 300})
        else:
            self._json(401, {"error": "invalid_grant"})

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":  # Go sends a form chunked
            return self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):
            body += self.rfile.read(size)
            self.rfile.readline()
        self.rfile.readline()
        return body

    def _serve(self, head: bool) -> None:
        if self.path.startswith("/token"):
            expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            if self.headers.get("Authorization") == expected:
                self._json(200, {"token": self.server.access_token, "expires_in": 300})
            else:
                self._json(401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]})
            return
        if self.headers.get("Authorization") != f"Bearer {self.server.access_token}":
            body = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
            self.send_response(401)
            self.send_header("WWW-Authenticate", f'Bearer realm="http://{self.server.host}/token",'
                                                 'service="podshim-test"')
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return
        self.server.seen.append(self.path)
        host, port = self.server.upstream.rsplit(":", 1)
        upstream = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            headers = {"Accept": ", ".join(self.headers.get_all("Accept") or ["*/*"])}
            upstream.request("HEAD" if head else "GET", self.path, headers=headers)
            response = upstream.getresponse()
            body = b"" if head else response.read()
            self.send_response(response.status)
            for name, value in response.getheaders():
                if name.lower() in ("content-type", "content-length", "docker-content-digest", "etag",
                                    "docker-distribution-api-version"):
                    self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        finally:
            upstream.close()


@pytest.fixture
def token_front(registry) -> Iterator[TokenFront]:
    front = TokenFront(registry.host)
    thread = threading.Thread(target=front.serve_forever, daemon=True)
    thread.start()
    try:
        yield front
    finally:
        front.shutdown()
        thread.join()
        front.server_close()


def images_behind(tmp_path, front: TokenFront) -> Images:
    return Images(str(tmp_path / "state"), hosts=[RegistryHost(front.host, insecure=True)]).open()


@pytest.fixture
def ref(test_images, token_front) -> str:
    return f"{token_front.host}/{test_images.busybox.repo}:{test_images.busybox.tag}"


async def test_no_credentials_is_unauthorized(tmp_path, token_front, ref) -> None:
    with pytest.raises(Unauthenticated, match="give credentials"):
        await images_behind(tmp_path, token_front).pull(ref)
    assert token_front.seen == []


async def test_a_registry_token_is_sent_as_the_bearer_token(tmp_path, token_front, ref, test_images) -> None:
    record = await images_behind(tmp_path, token_front).pull(ref, AuthConfig(registry_token=token_front.access_token))
    assert record.manifest_digest == test_images.busybox.digest
    assert any("/blobs/" in path for path in token_front.seen)


async def test_an_identity_token_is_exchanged_for_an_access_token(tmp_path, token_front, ref, test_images) -> None:
    record = await images_behind(tmp_path, token_front).pull(ref, AuthConfig(identity_token=token_front.refresh_token))
    assert record.manifest_digest == test_images.busybox.digest


async def test_username_and_password_get_a_token_from_the_realm(tmp_path, token_front, ref, test_images) -> None:
    record = await images_behind(tmp_path, token_front).pull(ref, AuthConfig(username=USER, password=PASSWORD))
    assert record.manifest_digest == test_images.busybox.digest


async def test_a_wrong_identity_token_is_unauthorized(tmp_path, token_front, ref) -> None:
    images = images_behind(tmp_path, token_front)
    with pytest.raises(Unauthenticated, match="refused the credentials given"):
        await images.pull(ref, AuthConfig(identity_token="not-the-refresh-token"))
    assert images.list() == [] and token_front.seen == []
