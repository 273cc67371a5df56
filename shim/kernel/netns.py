"""Network namespaces: create, describe and remove the sandbox's netns; open any namespace file.

A netns is kept alive by a bind mount of an nsfs file on an empty file, as iproute2 does
(``/var/run/netns/<name>``), so iproute2 and CNI plugins see ours. Creating one runs in the
*calling thread* only: unshare(CLONE_NEWNET) switches the netns of one thread, not the process,
and the thread is always switched back before returning.

pyroute2 is imported lazily and only by :func:`describe_netns`: its import is slow and large,
and must stay off the sandbox start path.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
import struct
import threading
from collections.abc import Iterable
from typing import Any

from shim.kernel import linux
from shim.lib.files import flock_open
from shim.lib.namespaces import (
    THREAD_NETNS,
    NamespaceNotFound,
    in_netns,
    ns_type,
    open_namespace,
    open_netns,
    return_to_netns,
    socket_in_netns,
)
from shim.rpc.status import AlreadyExists, InvalidArgument, error_from_oserror

log = logging.getLogger(__name__)

__all__ = ["NamespaceNotFound", "check_net_sysctls", "create_netns", "default_netns_dir", "describe_netns",
           "is_host_netns", "make_netns", "new_netns_path", "open_namespace", "open_netns", "remove_netns",
           "socket_in_netns"]

_NETNS_DIR = "/var/run/netns"

# <linux/sockios.h>, <net/if.h>; struct ifreq is a 16-byte name then a 24-byte union whose
# first member for these two calls is `short ifr_flags`.
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = struct.Struct("16sh22x")

# The network namespace this process started in: for a shim, the host's (a shim forked by the
# template has the template's). Read at import, before any thread of ours switches netns.
_HOST_NETNS = os.stat("/proc/self/ns/net")


def default_netns_dir() -> str:
    """Where netns files live, shared with iproute2: /var/run/netns."""
    return _NETNS_DIR


def new_netns_path(prefix: str = "podshim") -> str:
    """A fresh path ``/var/run/netns/<prefix>-<16 random hex digits>`` (not created).

    Raises InvalidArgument when ``prefix`` is empty or contains "/" or NUL.
    """
    if not prefix or "/" in prefix or "\0" in prefix:
        raise InvalidArgument(f"netns name prefix {prefix!r} must be a non-empty name without '/'")
    return f"{_NETNS_DIR}/{prefix}-{os.urandom(8).hex()}"  # not secrets: it loads hashlib


def make_netns() -> int:
    """A new network namespace with ``lo`` up, held only by the returned descriptor (close-on-exec):
    one made ahead of its sandbox (a spare shim's), for :func:`create_netns` to pin later. It goes
    away with the descriptor. Raises the OS error's status."""
    try:
        return _new_netns()
    except OSError as exc:
        raise error_from_oserror(exc, "cannot make a network namespace") from exc


def _new_netns() -> int:
    """:func:`make_netns`'s namespace; raises OSError."""
    saved = os.open(THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
    try:
        linux.unshare(linux.CLONE_NEWNET)
        try:
            _set_loopback_up()
            return os.open(THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
        finally:
            return_to_netns(saved)
    finally:
        os.close(saved)


def create_netns(path: str, made: int | None = None) -> str:
    """Create a new network namespace, pinned by a bind mount on ``path``, with ``lo`` up.

    ``made``: a descriptor of a namespace :func:`make_netns` made ahead, pinned instead of a new
    one (the caller still owns and closes the descriptor). ``path``'s directory is created if
    missing. The default directory is first made a shared mount (see :func:`_ensure_shared_dir`).
    Returns ``path``. On any failure nothing is left behind. Raises InvalidArgument (relative
    path), AlreadyExists (``path`` exists) or the OS error's status (:func:`error_from_oserror`).
    """
    if not os.path.isabs(path):
        raise InvalidArgument(f"netns path {path!r} must be absolute")
    directory = os.path.dirname(path)
    try:
        try:
            _create_netns_file(path, directory)
        except FileNotFoundError:  # made once per boot: not looked for first (makedirs costs 60 µs)
            os.makedirs(directory, mode=0o755, exist_ok=True)
            _create_netns_file(path, directory)
    except FileExistsError:
        raise AlreadyExists(f"netns file {path} already exists") from None
    except OSError as exc:
        raise error_from_oserror(exc, f"cannot create netns file {path}") from exc
    if made is not None and not _is_netns(made):
        # Never pin what is not a network namespace: a runtime told to join the path would fail
        # with EINVAL (crun's "cannot setns"). A new one costs only the head start.
        log.warning("the network namespace made ahead (fd %d) is %s now, not a network namespace: making a new one",
                    made, _describe_fd(made))
        made = None
    try:
        fd = _new_netns() if made is None else made
        try:
            linux.mount(f"/proc/self/fd/{fd}", path, None, linux.MS_BIND)  # the last step: nothing to undo after
        finally:
            if made is None:
                os.close(fd)
    except BaseException as exc:
        _unlink_quietly(path)
        if isinstance(exc, OSError):
            raise error_from_oserror(exc, f"cannot create netns {path}") from exc
        raise
    return path


def _is_netns(fd: int) -> bool:
    try:
        return ns_type(fd) == linux.CLONE_NEWNET
    except OSError:  # ENOTTY: not a namespace; EBADF: closed
        return False


def _describe_fd(fd: int) -> str:
    try:
        return repr(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError as exc:
        return f"unreadable ({os.strerror(exc.errno or 0)})"


def _create_netns_file(path: str, directory: str) -> None:
    """The empty file ``path`` (0444) in ``directory``, made a shared mount first when it is the
    default directory. Raises FileNotFoundError when ``directory`` is missing, other OSErrors."""
    if directory == _NETNS_DIR:
        _ensure_shared_dir(directory)
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444))


def remove_netns(path: str) -> None:
    """Unmount and delete a netns file made by :func:`create_netns`. Idempotent.

    A missing file or a file that is no longer mounted is fine. Raises InvalidArgument when
    ``path`` is something other than a netns file (a non-empty or non-regular file is never
    deleted), the OS error's status for other errors.
    """
    # MNT_DETACH: a process that still has the file open (ip netns exec, a CNI plugin) must
    # not make removal fail; the namespace dies when its last user goes.
    _umount_quietly(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_size != 0:
        raise InvalidArgument(f"{path} is not a netns file; not removing it")
    _unlink_quietly(path)


def check_net_sysctls(path: str, keys: Iterable[str]) -> None:
    """InvalidArgument unless every ``net.*`` key among ``keys`` can be set in the netns at ``path``.

    The kernel's own answer: /proc/sys/net shows each process the sysctls of its own network
    namespace, so the calling thread looks from inside it. A key that is missing there (no
    such key, a device the namespace does not have, or a setting the kernel keeps only for
    the host's initial namespace) or read-only there (net.core.rmem_max and the like, which
    newer kernels show read-only in every other namespace) would fail the pause's start with
    "Permission denied" or "No such file"; it is refused now instead. Other keys are not
    looked at. Raises NotFound when ``path`` is not a netns, the OS error's status when the
    thread cannot switch.
    """
    names = [key for key in keys if key.startswith("net.")]
    if not names:
        return
    modes = in_netns(path, lambda: {key: _sysctl_mode(key) for key in names})
    for key, mode in modes.items():
        if mode is None:
            raise InvalidArgument(f"sysctl {key} does not exist in the sandbox's network namespace (no such key in "
                                  "this kernel, a device the namespace does not have, or a setting only the host's "
                                  "namespace has)")
        if not mode & stat.S_IWUSR:
            raise InvalidArgument(f"sysctl {key} is not per network namespace: the kernel lets only the host's "
                                  "initial namespace set it")


def _sysctl_mode(key: str) -> int | None:
    try:
        return os.stat("/proc/sys/" + key.replace(".", "/")).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None


def describe_netns(path: str) -> list[dict[str, Any]]:
    """The interfaces of the netns at ``path``: ``[{"name", "index", "state", "addresses": [...]}]``.

    ``state`` is the operstate ("UP", "DOWN", "UNKNOWN"); addresses are "addr/prefixlen" strings.
    For diagnostics: it imports pyroute2 and blocks; from async code call it through
    ``asyncio.to_thread``. Raises NotFound when ``path`` is not a mounted netns.
    """
    # A dedicated thread: the netns switch stays off the caller's thread, and pyroute2's
    # synchronous API runs its own event loop, which it cannot do on a thread that runs one.
    result: list[list[dict[str, Any]] | BaseException] = []
    worker = threading.Thread(target=lambda: result.append(_describe_in_thread(path)), name="describe-netns")
    worker.start()
    worker.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _describe_in_thread(path: str) -> list[dict[str, Any]] | BaseException:
    try:
        from pyroute2 import IPRoute

        ipr = in_netns(path, IPRoute)  # a netlink socket belongs to the netns it was created in
        with ipr:
            addresses: dict[int, list[str]] = {}
            for msg in ipr.get_addr():
                addresses.setdefault(msg["index"], []).append(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}")
            return [
                {
                    "name": link.get_attr("IFLA_IFNAME"),
                    "index": link["index"],
                    "state": link.get_attr("IFLA_OPERSTATE"),
                    "addresses": addresses.get(link["index"], []),
                }
                for link in ipr.get_links()
            ]
    except BaseException as exc:  # handed to the caller's thread
        return exc


def is_host_netns(fd: int) -> bool:
    """Whether the namespace open on ``fd`` is the network namespace this process started in
    (the host's), whatever path it was opened by: a bind mount of it is the host too."""
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (_HOST_NETNS.st_dev, _HOST_NETNS.st_ino)


#: The columns of /proc/<pid>/net/dev a pod's network figures take (receive, then transmit).
_NET_DEV_COLUMNS = {"rx_bytes": 0, "rx_packets": 1, "rx_errors": 2, "rx_dropped": 3,
                    "tx_bytes": 8, "tx_packets": 9, "tx_errors": 10, "tx_dropped": 11}


def interface_counters(pid: int) -> dict[str, dict[str, int]] | None:
    """The counters of every interface but loopback in the network namespace of process ``pid``
    (its /proc/<pid>/net/dev): ``{"eth0": {"rx_bytes", "rx_packets", "rx_errors", "rx_dropped",
    "tx_...": n}}``; None when the process is in the host's namespace (its figures are the
    node's, not a pod's) or gone."""
    try:
        st = os.stat(f"/proc/{pid}/ns/net")
        if (st.st_dev, st.st_ino) == (_HOST_NETNS.st_dev, _HOST_NETNS.st_ino):
            return None
        with open(f"/proc/{pid}/net/dev") as f:
            lines = f.read().splitlines()[2:]
    except OSError:
        return None
    found = {}
    for line in lines:
        name, _, rest = line.partition(":")
        fields = rest.split()
        name = name.strip()
        if name == "lo" or len(fields) < 16:
            continue
        found[name] = {key: int(fields[i]) for key, i in _NET_DEV_COLUMNS.items()}
    return found


def _ensure_shared_dir(directory: str) -> None:
    """Make ``directory`` a shared mount point, as ``ip netns add`` does.

    The netns bind mounts below it must be shared so that each pause's mount namespace (a
    recursive slave copy, see shim.runtime.pause) receives their umounts. Were they private, every
    pause started after netns X would keep X's nsfs mount, and with it X, alive forever.
    """
    try:
        linux.mount(None, directory, None, linux.MS_SHARED | linux.MS_REC)
        return
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: not a mount point yet
            raise
    # Serialise with other shims doing the same, so the directory is bind-mounted once. The
    # lock is on the directory's inode, which the bind mount of itself does not change.
    with flock_open(directory, create=False):
        try:
            linux.mount(None, directory, None, linux.MS_SHARED | linux.MS_REC)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            linux.mount(directory, directory, None, linux.MS_BIND | linux.MS_REC)
            linux.mount(None, directory, None, linux.MS_SHARED | linux.MS_REC)


def _set_loopback_up() -> None:
    # The socket is created after unshare, so its ioctls act on the new netns.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        _, flags = _IFREQ.unpack(fcntl.ioctl(sock, _SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0)))
        fcntl.ioctl(sock, _SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | _IFF_UP))





def _umount_quietly(path: str) -> None:
    try:
        linux.umount2(path, linux.MNT_DETACH)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOENT):  # not mounted, or gone
            raise error_from_oserror(exc, f"cannot unmount netns {path}") from exc


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise error_from_oserror(exc, f"cannot delete netns file {path}") from exc
