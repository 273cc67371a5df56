"""Bundle directories under the state root: ``<state_root>/<namespace>/<sandbox_id>/``.

A bundle is made 0700 (parents 0711), never through a symbolic link, and removed atomically: renamed to a hidden
``<namespace>/.<sandbox_id>.<random>`` first, so a crash half-way through the removal leaves a
name the next scan recognises as garbage, never a half-deleted bundle that looks like a sandbox.

While one process creates, loads or removes a sandbox it holds an exclusive ``flock`` on the
bundle directory (:class:`BundleLock`), so a second controller over the same state root
(``podshimctl`` while a daemon runs) skips a sandbox that is half-made instead of "cleaning it
up". A bundle is born locked: made under a hidden name, locked, then renamed into place without
replacing anything, so no other process ever finds it under its name unlocked and empty. The
kernel drops the lock when its holder dies, so a killed controller never leaves one.

A Controller removes only what it can prove it made (:func:`made_here`): a bundle that carries
its marker (:mod:`client.layouts`; written before the bundle gets its name), or one made before
markers existed that holds a podshim shim's bootstrap.json. Anything else under the root is
left alone, whatever it looks like: the root may be a directory another program lays out
another way.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from shim.api.identifiers import validate_identifier
from shim.api.names import PROTOCOL, STATE_FILE
from shim.lib.files import decode_json, ensure_private_dir, flock_open, read_json, rename_noreplace
from shim.lib.processes import open_pidfd, process_alive
from shim.lib.trees import remove_tree
from shim.rpc.status import AlreadyExists, InvalidArgument, NotFound, Unavailable, error_from_oserror

from client import layouts
from client.controller.results import BOOTSTRAP_FILE, Bootstrap

__all__ = ["bundle_path", "make_bundle", "remove_bundle", "read_bootstrap", "read_shim_process", "scan",
           "made_here", "BundleLock", "ShimProcess"]

log = logging.getLogger(__name__)

_BUNDLE_MODE = 0o700
_PARENT_MODE = 0o711  # others may traverse (to reach a socket or rootfs below), never list
#: The hidden name make_bundle and remove_bundle give a bundle on its way in or out.
_LEFTOVER = re.compile(r"\.[A-Za-z0-9][A-Za-z0-9._-]*\.[0-9a-f]{8}")
#: More than any bootstrap.json a shim writes.
_MAX_BOOTSTRAP_BYTES = 64 * 1024


def bundle_path(state_root: str, namespace: str, sandbox_id: str) -> str:
    """``<state_root>/<namespace>/<sandbox_id>``; raises InvalidArgument for a bad identifier."""
    validate_identifier("namespace", namespace)
    validate_identifier("sandbox id", sandbox_id)
    return os.path.join(state_root, namespace, sandbox_id)


def make_bundle(state_root: str, namespace: str, sandbox_id: str, lock: BundleLock | None = None) -> str:
    """Create an empty bundle (parents as needed) and return its path. With ``lock`` (a
    BundleLock of that path), the bundle's flock is held by ``lock`` on return.

    The bundle appears under its name already locked: another controller that finds it then
    skips it as being changed, never takes it for the leftover of a dead create. Two creates of
    one id race on the final rename, which replaces nothing: one wins, the other is
    AlreadyExists.

    The root is marked as a bundle root if it is not yet, and the bundle carries the marker
    that proves a Controller made it (:func:`made_here`) from before it has its name.

    Raises AlreadyExists when the directory exists (another controller's sandbox, or one this
    controller has not loaded), InvalidArgument for a bad identifier, FailedPrecondition when
    the root is marked as another layout (podshimd's state root), OSError when the state
    root or the namespace directory is a symbolic link (bundles would land outside the root,
    where no scan finds them) or cannot be made.
    """
    path = bundle_path(state_root, namespace, sandbox_id)
    parent = os.path.dirname(path)
    # Existing parents keep the mode their owner gave them.
    ensure_private_dir(state_root, _PARENT_MODE, keep_mode=True)
    layouts.claim(state_root, layouts.BUNDLE_ROOT)
    ensure_private_dir(parent, _PARENT_MODE, keep_mode=True)
    exists = AlreadyExists(f"sandbox {sandbox_id} already exists in namespace {namespace} "
                           f"(its bundle {path} is there)")
    if os.path.lexists(path):
        raise exists
    # A hidden name: a scan leaves it alone while it is locked and removes it once it is not
    # (we died before the rename). os.urandom, not secrets: secrets imports hmac and OpenSSL's
    # _hashlib, 9-11 ms of every podshimctl that loads the Controller (bench/cli_latency.py).
    made = os.path.join(parent, f".{sandbox_id}.{os.urandom(4).hex()}")
    os.mkdir(made, _BUNDLE_MODE)
    fd = None
    try:
        fd = os.open(made, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours alone: nobody knows the name
        os.fchmod(fd, _BUNDLE_MODE)  # mkdir's mode went through the umask
        # Not durable: a bundle a power cut leaves unmarked is left alone, never mistaken.
        layouts.mark(made, layouts.BUNDLE, durable=False)
        try:
            renamed = rename_noreplace(made, path)
        except FileExistsError:
            raise exists from None
        if not renamed:
            # No RENAME_NOREPLACE here (an old kernel or an odd filesystem): make it in place,
            # with the short window before its lock that this otherwise closes.
            os.rmdir(made)
            os.close(fd)
            fd = None
            try:
                os.mkdir(path, _BUNDLE_MODE)
            except FileExistsError:
                raise exists from None
            ensure_private_dir(path, _BUNDLE_MODE)
            layouts.mark(path, layouts.BUNDLE, durable=False)
            if lock is not None and not lock.try_acquire():
                raise Unavailable(f"bundle {path} was taken by another process while being made (this filesystem "
                                  "cannot rename without replacing); try again")
            return path
    except BaseException:
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(made)
        raise
    if lock is not None:
        lock.adopt(fd)
    else:
        os.close(fd)
    return path


def remove_bundle(path: str) -> None:
    """Remove a bundle atomically: rename it to a hidden name, then delete the tree.

    Missing is fine (removal is idempotent). OSErrors other than that propagate.
    """
    parent, name = os.path.split(path)
    hidden = os.path.join(parent, f".{name}.{os.urandom(4).hex()}")
    try:
        os.rename(path, hidden)
    except FileNotFoundError:
        return
    remove_tree(hidden, ignore_errors=True)


def read_bootstrap(bundle: str) -> Bootstrap:
    """The bundle's bootstrap.json; NotFound when absent, Internal when it is not valid
    (:class:`Bootstrap`), the OS error's status when it cannot be read."""
    path = os.path.join(bundle, BOOTSTRAP_FILE)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        raise NotFound(f"{path} does not exist (the shim never started)") from None
    except OSError as exc:
        raise error_from_oserror(exc, f"cannot read {path}") from None
    return Bootstrap.from_json(text, source=path)


@dataclass(frozen=True, slots=True)
class ShimProcess:
    """The shim's process: its pid and, when recorded, its start time (which names it across
    pid reuse). Whether the shim lives is decided here, never by whether it answers."""

    pid: int
    start_time: int | None

    def alive(self) -> bool:
        """Whether the shim's process runs (a stopped one does; a zombie does not)."""
        return process_alive(self.pid, self.start_time)

    def open_pidfd(self) -> int | None:
        """A pidfd for the shim's process, or None when it is gone (the caller closes it)."""
        return open_pidfd(self.pid, self.start_time)

    def __str__(self) -> str:
        return f"pid {self.pid}"


def read_shim_process(bundle: str, boot: Bootstrap | None) -> ShimProcess | None:
    """Which process the bundle's shim is: from its bootstrap, else from the shim's own
    state.json (``shim_pid``, ``shim_start_time``); None when neither names one.

    An older shim's bootstrap has no start time: state.json's is used when it names the same
    pid, else the pid alone (a pid reused since then reads as alive: the side that loses nothing).
    """
    if boot is not None and boot.pid > 0 and boot.start_time is not None:
        return ShimProcess(boot.pid, boot.start_time)
    recorded = _recorded_shim(bundle)
    if boot is not None and boot.pid > 0:
        if recorded is not None and recorded.pid == boot.pid:
            return recorded
        return ShimProcess(boot.pid, None)
    return recorded


def _recorded_shim(bundle: str) -> ShimProcess | None:
    path = os.path.join(bundle, STATE_FILE)
    try:
        record = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("cannot read the shim's pid from %s: %s", path, exc)
        return None
    pid = record.get("shim_pid") if isinstance(record, dict) else None
    start_time = record.get("shim_start_time") if isinstance(record, dict) else None
    if not _is_count(pid) or pid == 0:
        return None
    assert isinstance(pid, int)  # _is_count said so
    return ShimProcess(pid, start_time if _is_count(start_time) else None)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entries(directory: str) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            yield from it
    except FileNotFoundError:
        return


def made_here(bundle: str) -> bool:
    """Whether a Controller provably made the directory ``bundle``: it carries the bundle marker,
    or (made before markers existed) it holds a podshim shim's bootstrap.json (a JSON object
    with our protocol and a unix address). Whatever else is found is not ours to remove."""
    try:
        if layouts.marked_as(bundle) == layouts.BUNDLE:
            return True
        with open(os.path.join(bundle, BOOTSTRAP_FILE), "rb", opener=_no_follow) as f:
            doc = decode_json(f.read(_MAX_BOOTSTRAP_BYTES), BOOTSTRAP_FILE)
    except (OSError, ValueError):
        return False
    return (isinstance(doc, dict) and doc.get("protocol") == PROTOCOL
            and isinstance(doc.get("address"), str) and doc["address"].startswith("unix:///"))


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def scan(state_root: str, namespace: str | None = None, *, clean: bool = True) -> list[tuple[str, str, str]]:
    """The candidate bundles under ``state_root`` (or of one namespace): ``(namespace,
    sandbox_id, path)``, every directory whose name is an identifier; whether each is a bundle
    a Controller made is :func:`made_here`'s to say.

    With ``clean``, hidden entries in a namespace that are leftovers of a bundle's creation or
    removal a crash interrupted (``.<id>.<8 hex digits>``, under a root marked as a bundle root
    or themselves carrying a bundle's proof) are deleted. Names that are not identifiers are
    skipped with a warning (nobody we know made them, so we do not delete them either).
    """
    if namespace is not None:
        validate_identifier("namespace", namespace)
        spaces = [namespace] if _is_namespace_dir(os.path.join(state_root, namespace)) else []
    else:
        spaces = []
        for entry in _entries(state_root):
            if entry.name.startswith(".") or not _is_namespace_dir(entry.path):
                continue
            if not _is_identifier(entry.name):
                log.warning("skipping %s: not a valid namespace name", entry.path)
                continue
            spaces.append(entry.name)
    found = []
    root_is_ours = None
    for ns in sorted(spaces):
        for entry in _entries(os.path.join(state_root, ns)):
            if entry.name.startswith("."):
                if clean and _LEFTOVER.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                    if root_is_ours is None:
                        root_is_ours = _marked_bundle_root(state_root)
                    _remove_leftover(entry, root_is_ours)
                continue
            if not entry.is_dir(follow_symlinks=False) or not _is_identifier(entry.name):
                log.warning("skipping %s: not a sandbox bundle (bad name or not a directory)", entry.path)
                continue
            found.append((ns, entry.name, entry.path))
    return sorted(found)


def _marked_bundle_root(state_root: str) -> bool:
    try:
        return layouts.marked_as(state_root) == layouts.BUNDLE_ROOT
    except OSError:
        return False


def _remove_leftover(entry: os.DirEntry[str], root_is_ours: bool) -> None:
    """Remove a hidden directory of a namespace directory named as a bundle whose removal or
    creation a crash interrupted: in a root marked as ours any such (its marker may be among
    what the removal took already), elsewhere only one that proves it was a bundle. One that is
    locked is being made or removed right now, and is left alone."""
    lock = BundleLock(entry.path)
    if not lock.try_acquire():
        return
    try:
        if not root_is_ours and not made_here(entry.path):
            log.warning("leaving %s alone: named like a bundle's leftover, but %s is not marked as a bundle "
                        "root and nothing in it says a Controller made it", entry.path,
                        os.path.dirname(os.path.dirname(entry.path)))
            return
        log.info("removing %s, left by an interrupted bundle creation or removal", entry.path)
        remove_tree(entry.path, ignore_errors=True)
    finally:
        lock.release()


def _is_namespace_dir(path: str) -> bool:
    """A real directory; a symbolic link is skipped with a warning, never followed."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode):
        log.warning("skipping %s: a symbolic link, not a namespace directory (podshim does not follow links "
                    "in its state root)", path)
    return stat.S_ISDIR(mode)


def _is_identifier(name: str) -> bool:
    try:
        validate_identifier("name", name)
    except InvalidArgument:
        return False
    return True


class BundleLock:
    """An exclusive flock on a bundle directory, held while this process changes the sandbox."""

    def __init__(self, path: str):
        self.path = path
        self._held: contextlib.ExitStack | None = None

    def try_acquire(self) -> bool:
        """Take the lock without blocking (True at once if this lock holds it already). False
        when another process holds it or the bundle has gone (removed by another process in
        between)."""
        if self._held is not None:
            return True
        with contextlib.ExitStack() as held:
            try:
                if held.enter_context(flock_open(self.path, blocking=False, create=False)) is None:
                    return False
            except FileNotFoundError:
                return False
            self._held = held.pop_all()
        return True

    def adopt(self, fd: int) -> None:
        """Hold the lock through ``fd``, a descriptor of the bundle that has its flock already
        (:func:`make_bundle`); released by :meth:`release`."""
        self.release()
        self._held = contextlib.ExitStack()
        self._held.callback(os.close, fd)

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        held, self._held = self._held, None
        if held is not None:
            held.close()

    @property
    def held(self) -> bool:
        return self._held is not None
