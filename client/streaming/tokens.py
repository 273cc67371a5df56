"""One-time tokens: what the URL of an Exec, Attach or PortForward answer carries.

A CRI call stores its request under a fresh random token and returns a URL with the token in its
path; the first connection that presents the token takes the request and the token is gone, so a
URL cannot be replayed. An unused token expires after :data:`TOKEN_TTL` seconds (containerd's 1
minute). At most :data:`MAX_TOKENS` wait at once (containerd: 1000): beyond that a CRI call is
refused rather than letting unused URLs grow without bound.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from shim.rpc.status import ResourceExhausted

__all__ = ["TOKEN_TTL", "MAX_TOKENS", "TOKEN_BYTES", "TokenError", "Tokens"]

TOKEN_TTL = 60.0
MAX_TOKENS = 1000
#: Random bytes per token (base64url in the URL): guessing one is hopeless within its minute.
TOKEN_BYTES = 18


class TokenError(Exception):
    """A token that is unknown, already used or expired; ``str()`` says which, for the HTTP answer."""


class Tokens:
    """Requests waiting for their streaming connection, by token. ``clock`` is monotonic seconds."""

    def __init__(self, *, ttl: float = TOKEN_TTL, max_tokens: int = MAX_TOKENS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.max_tokens = max_tokens
        self._clock = clock
        self._waiting: OrderedDict[str, tuple[float, Any]] = OrderedDict()  # token -> (deadline, request)

    def __len__(self) -> int:
        self._expire()
        return len(self._waiting)

    def insert(self, request: Any) -> str:
        """Store ``request`` under a new token; return the token. Raises ResourceExhausted when
        :attr:`max_tokens` are already waiting."""
        self._expire()
        if len(self._waiting) >= self.max_tokens:
            raise ResourceExhausted(f"{self.max_tokens} streaming URLs are already waiting to be used; "
                                    f"try again when some are used or expire ({self.ttl:.0f} s)")
        token = secrets.token_urlsafe(TOKEN_BYTES)
        self._waiting[token] = (self._clock() + self.ttl, request)
        return token

    def consume(self, token: str) -> Any:
        """The request stored under ``token``, which is then gone. Raises TokenError."""
        self._expire()
        entry = self._waiting.pop(token, None)
        if entry is None:
            raise TokenError("the streaming URL's token is unknown, already used, or expired (a URL is good "
                             f"for one connection within {self.ttl:.0f} s of the call that returned it)")
        return entry[1]

    def _expire(self) -> None:
        now = self._clock()
        # Insertion order is deadline order (one ttl for all).
        while self._waiting:
            token, (deadline, _) = next(iter(self._waiting.items()))
            if deadline > now:
                break
            del self._waiting[token]
