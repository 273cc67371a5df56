"""Identifier rules for namespaces and sandbox ids (protocol.md, section 7): containerd's."""

from __future__ import annotations

import re
from typing import Any

from shim.rpc.status import InvalidArgument

__all__ = ["MAX_IDENTIFIER_CHARS", "validate_identifier"]

MAX_IDENTIFIER_CHARS = 76
_IDENTIFIER = re.compile(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")


def validate_identifier(kind: str, value: Any) -> str:
    """Return ``value`` if it is a valid identifier, else raise InvalidArgument.

    Letters and digits, joined by single ``.``, ``_`` or ``-``; 1 to 76 characters. Such a
    name is safe as one path component: it can never be ``..`` or contain ``/``.
    """
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{kind} must be a non-empty string")
    if len(value) > MAX_IDENTIFIER_CHARS:
        raise InvalidArgument(
            f"{kind} {value[:20]!r}... is {len(value)} characters; at most {MAX_IDENTIFIER_CHARS} are allowed")
    if not _IDENTIFIER.fullmatch(value):
        raise InvalidArgument(f"{kind} {value!r} is not valid: use letters and digits joined by single '.', '_' or '-'")
    return value
