"""Reading cgroup files: the kernel's one-value, flat-keyed and process-list files, and a
cgroup's subtree; a file that cannot be read reads as None."""

from __future__ import annotations

import os

from shim.lib.files import read_file
from shim.lib.trees import walk

__all__ = ["read_bytes", "read_pids", "read_text", "read_int", "read_flat_keyed", "read_keyed", "enabled", "subtree"]


def subtree(path: str) -> list[str]:
    """``path`` and every cgroup below it, parents before children; [] if missing."""
    try:
        return [path, *(entry.path(path) for entry in walk(path) if entry.is_dir)]
    except (FileNotFoundError, NotADirectoryError):
        return []



def read_bytes(path: str) -> bytes:
    return read_file(path).strip()


def read_pids(directory: str) -> list[int]:
    try:
        return [int(line) for line in read_bytes(os.path.join(directory, "cgroup.procs")).split()]
    except FileNotFoundError:
        return []  # removed while we walked


def read_text(directory: str, name: str) -> str | None:
    try:
        return read_bytes(os.path.join(directory, name)).decode()
    except (OSError, UnicodeDecodeError):
        return None


def read_int(directory: str, name: str) -> int | None:
    text = read_text(directory, name)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def read_flat_keyed(directory: str, name: str) -> dict[str, int] | None:
    """Every ``key value`` line of a flat-keyed file such as memory.stat; None if unreadable."""
    text = read_text(directory, name)
    if text is None:
        return None
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            values[parts[0]] = int(parts[1])
    return values



def enabled(directory: str | None, controller: str) -> bool:
    """Whether ``controller`` is enabled on the v2 cgroup ``directory``."""
    return directory is not None and controller in (read_text(directory, "cgroup.controllers") or "").split()


def read_keyed(directory: str, name: str, key: str) -> int | None:
    """The value of ``key`` in a flat-keyed file such as cpu.stat."""
    text = read_text(directory, name)
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return None
