"""Namespaces as the calling thread enters them: the namespace types, a namespace file opened and
checked for its type, the thread moved into a network namespace and back, and a socket made there
(a socket keeps the netns it was created in). Both sides use it: the shim's network namespaces
(:mod:`shim.kernel.netns`) and podshimd's port-forward, which connects into a pod's netns. Only the
standard library (ctypes for setns(2), which Python 3.11's os lacks).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
from collections.abc import Callable
from typing import TypeVar

from shim.rpc.status import Internal, InvalidArgument, NotFound, error_from_oserror

__all__ = ["CLONE_NEWCGROUP", "CLONE_NEWIPC", "CLONE_NEWNET", "CLONE_NEWNS", "CLONE_NEWPID", "CLONE_NEWTIME",
           "CLONE_NEWUSER", "CLONE_NEWUTS", "THREAD_NETNS", "NamespaceNotFound", "in_netns", "ns_type",
           "open_namespace", "open_netns", "return_to_netns", "setns", "socket_in_netns"]

# <linux/sched.h>
CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# <linux/nsfs.h>: _IO(0xb7, 0x3)
_NS_GET_NSTYPE = 0xB703

#: The calling thread's own network namespace.
THREAD_NETNS = "/proc/thread-self/ns/net"

_T = TypeVar("_T")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


def setns(fd: int, nstype: int = 0) -> None:
    """Move the calling thread into the namespace open on ``fd``; ``nstype`` 0 accepts any type.

    Raises OSError (EINVAL when ``fd`` is not a namespace of ``nstype``).
    """
    if _libc.setns(fd, nstype) == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def ns_type(fd: int) -> int:
    """The ``CLONE_NEW*`` type of the namespace open on ``fd`` (NS_GET_NSTYPE, Linux 4.11).

    Raises OSError (ENOTTY when ``fd`` is not a namespace, e.g. an unmounted netns file).
    """
    return fcntl.ioctl(fd, _NS_GET_NSTYPE)


class NamespaceNotFound(NotFound):
    """NotFound for a namespace file that does not exist (``/proc/PID/ns/ipc`` of a process that
    exited, a netns file removed): ``path`` names it."""

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path


_NS_KINDS = {
    CLONE_NEWNS: "mount",
    CLONE_NEWUTS: "uts",
    CLONE_NEWIPC: "ipc",
    CLONE_NEWPID: "pid",
    CLONE_NEWNET: "network",
    CLONE_NEWCGROUP: "cgroup",
    CLONE_NEWUSER: "user",
}


def open_namespace(path: str, nstype: int) -> int:
    """An O_CLOEXEC fd on the namespace at ``path`` (``/proc/PID/ns/ipc``, a netns file), for setns.

    The kernel says what the file is (NS_GET_NSTYPE): it must be a namespace of ``nstype``
    (``CLONE_NEW*``). The caller closes the fd. Raises NamespaceNotFound when ``path`` is
    missing, NotFound when it is not a namespace of that type, InvalidArgument for a type this function does not know.
    """
    kind = _NS_KINDS.get(nstype)
    if kind is None:
        raise InvalidArgument(f"cannot open {path}: namespace type {nstype:#x} is not supported")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        raise NamespaceNotFound(f"{kind} namespace {path} does not exist", path=path) from None
    try:
        if ns_type(fd) != nstype:
            raise NotFound(f"{path} is not a {kind} namespace")
    except OSError:
        os.close(fd)
        raise NotFound(f"{path} is not a mounted {kind} namespace") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_netns(path: str) -> int:
    """:func:`open_namespace` for a network namespace. Raises NotFound."""
    return open_namespace(path, CLONE_NEWNET)


def in_netns(path: str, fn: Callable[[], _T]) -> _T:
    """``fn()`` run with the calling thread in the netns at ``path``; the thread is back in its
    own before this returns. Raises NotFound (not a netns) or the OS error's status (cannot switch)."""
    target = open_netns(path)
    try:
        saved = os.open(THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                setns(target, CLONE_NEWNET)
            except OSError as exc:
                raise error_from_oserror(exc, f"cannot enter netns {path}") from exc
            try:
                return fn()
            finally:
                return_to_netns(saved)
        finally:
            os.close(saved)
    finally:
        os.close(target)


def socket_in_netns(path: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A new socket (close-on-exec) in the netns at ``path``, made by the calling thread from inside
    it: a socket keeps the netns it was created in, so it can be connected from anywhere afterwards.
    Blocks briefly (setns): call it from a worker thread. Raises NotFound, or the OS error's status."""
    return in_netns(path, lambda: socket.socket(family, kind | socket.SOCK_CLOEXEC))


def return_to_netns(saved_fd: int) -> None:
    try:
        setns(saved_fd, CLONE_NEWNET)
    except OSError as exc:
        # The thread would keep running in the wrong netns; nothing sensible can continue.
        raise Internal(f"cannot return the thread to its network namespace: {exc.strerror}") from exc
