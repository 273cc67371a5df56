"""skopeo's dialect: what a pull gives skopeo (registries.conf, policy, auth file, command line,
environment) and what its answers mean (:func:`skopeo_error`: one sentence and a status).

Credentials (CRI's AuthConfig) go to skopeo in an auth file (containers-auth.json(5), 0600 in the
0700 work directory), never on its command line, except a registry token, which skopeo 1.9 takes
only as ``--src-registry-token``. skopeo sees only the registries.conf, policy and auth file made
for its pull (its environment is clean: no ``~/.docker/config.json`` or system registries.conf is
read), and dies with podshimd (PR_SET_PDEATHSIG, through setpriv). Its errors become one sentence
and a status: 404 NOT_FOUND, 401 UNAUTHENTICATED, a blob whose digest does not match DATA_LOSS
naming the blob, an unreachable registry UNAVAILABLE."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shim.rpc.status import (
    DataLoss,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RpcError,
    Unauthenticated,
    Unavailable,
    Unknown,
)

from client.processes import run as run_helper

from .reference import DEFAULT_DOMAIN, Reference

__all__ = ["SKOPEO", "SETPRIV", "SKOPEO_PATH", "AuthConfig", "RegistryHost", "Session", "registry_host",
           "registries_conf", "auth_file", "skopeo_error", "policy"]

SKOPEO = "skopeo"
SETPRIV = "/usr/bin/setpriv"  # util-linux: --pdeathsig, so skopeo dies with the daemon
SKOPEO_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_DOCKER_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io", "docker.io")


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
        message = str(found[-1]).encode().decode("unicode_escape", errors="replace")
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


def policy() -> bytes:
    """The signature policy skopeo is given: accept anything."""
    # containerd verifies no signatures either; the host's policy.json is not ours to follow.
    return json.dumps({"default": [{"type": "insecureAcceptAnything"}]}).encode()


@dataclass(frozen=True)
class Session:
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
