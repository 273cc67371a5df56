"""Status codes and the typed errors that carry them.

Codes are gRPC's, with gRPC's numbers (protocol.md, "Status codes"). A handler raises
``NotFound(f"sandbox {sandbox_id!r}")``; the server turns it into a response status in one
place (:func:`shim.rpc.dispatch.status_from_exception`); the client turns the status back into
the same class (:func:`error_from_status`), so a caller writes ``except NotFound``. An OSError
has the status of its errno (:data:`ERRNO_CODES`); code that can say more than the errno does
raises :func:`error_from_oserror`'s error with its own sentence.
"""

from __future__ import annotations

import enum
import errno
from typing import Any

__all__ = [
    "Code",
    "RpcError",
    "Cancelled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
    "ERRNO_CODES",
    "code_for_errno",
    "error_from_oserror",
    "error_from_status",
]


class Code(enum.IntEnum):
    """gRPC status codes, with their wire numbers."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """An error with a status code and a sentence for a person.

    ``details`` is a list of msgpack-serialisable values sent as the status details.
    """

    code: Code = Code.UNKNOWN

    def __init__(self, message: str = "", *, details: list[Any] | None = None, code: Code | None = None):
        super().__init__(message)
        if code is not None:
            self.code = Code(code)
        self.message = message
        self.details = list(details or [])

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}" if self.message else self.code.name

    def __reduce__(self) -> tuple[Any, ...]:  # keep the code when pickled (multiprocessing, tests)
        return (_rebuild, (int(self.code), self.message, self.details))


def _rebuild(code: int, message: str, details: list[Any]) -> RpcError:
    return error_from_status(code, message, details)


# One class per code, written out (not made by a factory) so that type checkers know them.
class Cancelled(RpcError):
    """Status CANCELLED (1)."""

    code = Code.CANCELLED


class Unknown(RpcError):
    """Status UNKNOWN (2)."""

    code = Code.UNKNOWN


class InvalidArgument(RpcError):
    """Status INVALID_ARGUMENT (3)."""

    code = Code.INVALID_ARGUMENT


class DeadlineExceeded(RpcError):
    """Status DEADLINE_EXCEEDED (4)."""

    code = Code.DEADLINE_EXCEEDED


class NotFound(RpcError):
    """Status NOT_FOUND (5)."""

    code = Code.NOT_FOUND


class AlreadyExists(RpcError):
    """Status ALREADY_EXISTS (6)."""

    code = Code.ALREADY_EXISTS


class PermissionDenied(RpcError):
    """Status PERMISSION_DENIED (7)."""

    code = Code.PERMISSION_DENIED


class ResourceExhausted(RpcError):
    """Status RESOURCE_EXHAUSTED (8)."""

    code = Code.RESOURCE_EXHAUSTED


class FailedPrecondition(RpcError):
    """Status FAILED_PRECONDITION (9)."""

    code = Code.FAILED_PRECONDITION


class Aborted(RpcError):
    """Status ABORTED (10)."""

    code = Code.ABORTED


class OutOfRange(RpcError):
    """Status OUT_OF_RANGE (11)."""

    code = Code.OUT_OF_RANGE


class Unimplemented(RpcError):
    """Status UNIMPLEMENTED (12)."""

    code = Code.UNIMPLEMENTED


class Internal(RpcError):
    """Status INTERNAL (13)."""

    code = Code.INTERNAL


class Unavailable(RpcError):
    """Status UNAVAILABLE (14)."""

    code = Code.UNAVAILABLE


class DataLoss(RpcError):
    """Status DATA_LOSS (15)."""

    code = Code.DATA_LOSS


class Unauthenticated(RpcError):
    """Status UNAUTHENTICATED (16)."""

    code = Code.UNAUTHENTICATED


_BY_CODE: dict[int, type[RpcError]] = {
    cls.code: cls
    for cls in (
        Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
        PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
        Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated,
    )
}


def error_from_status(code: int, message: str = "", details: list[Any] | None = None) -> RpcError:
    """Build the typed error for a non-OK status received from a peer.

    A code outside 1..16 becomes :class:`Unknown` with the number kept in the message.
    """
    cls = _BY_CODE.get(code)
    if cls is None:
        return Unknown(f"unknown status code {code}: {message}", details=details)
    return cls(message, details=details)


#: The status of an OSError by its errno; any other errno is INTERNAL.
ERRNO_CODES: dict[int, Code] = {
    errno.ENOENT: Code.NOT_FOUND,
    errno.EEXIST: Code.ALREADY_EXISTS,
    errno.EPERM: Code.PERMISSION_DENIED,
    errno.EACCES: Code.PERMISSION_DENIED,
    errno.EBUSY: Code.FAILED_PRECONDITION,
    errno.ENOSPC: Code.RESOURCE_EXHAUSTED,
}


def code_for_errno(err: int | None) -> Code:
    """The status code of an OS error number (:data:`ERRNO_CODES`); INTERNAL for the rest."""
    return ERRNO_CODES.get(err, Code.INTERNAL) if err is not None else Code.INTERNAL


def error_from_oserror(exc: OSError, what: str) -> RpcError:
    """The typed error for ``exc`` with the sentence ``"{what}: {reason}"``: for code that knows
    what it was doing when the OS refused (``raise error_from_oserror(exc, f"cannot create
    cgroup {path}") from exc``). The class is the errno's (:func:`code_for_errno`)."""
    return _BY_CODE[code_for_errno(exc.errno)](f"{what}: {exc.strerror or exc}")
