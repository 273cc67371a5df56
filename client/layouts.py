"""What a podshim directory is: the marker file a root, or a bundle, carries (docs/roots.md).

Two layouts live on a node, and a program that took one for the other would read the wrong
things as its own: a Controller's bundle root (``<root>/<namespace>/<sandbox id>/``) and podshimd's
state root (``pods/``, ``images/``, ``logs/``, ``pod-files/``, and its Controller's bundle root in
``sandboxes/``). Each says what it is in a small file, :data:`MARKER`, whose one line is the
layout's name; so does each bundle a Controller makes. A program opens a root only when it is
unmarked or marked as its own layout (:func:`check`), and marks it when it first writes there
(:func:`claim`).
"""

from __future__ import annotations

import os

from shim.lib.files import write_atomic
from shim.rpc.status import FailedPrecondition, error_from_oserror

__all__ = ["MARKER", "BUNDLE_ROOT", "BUNDLE", "POD_ROOT", "SANDBOXES_DIR", "marked_as", "mark", "check", "claim"]

#: The marker's file name, in the directory it describes (hidden: scans pass over it).
MARKER = ".podshim-layout"
#: A Controller's bundle root.
BUNDLE_ROOT = "podshim-bundle-root"
#: One sandbox's bundle, made by a Controller.
BUNDLE = "podshim-bundle"
#: podshimd's state root.
POD_ROOT = "podshimd-state-root"
#: podshimd's Controller's bundle root, in its state root.
SANDBOXES_DIR = "sandboxes"

_MAX_MARKER_BYTES = 256
_NAMES = {BUNDLE_ROOT: "a Controller's bundle root", BUNDLE: "one sandbox's bundle", POD_ROOT: "podshimd's state root"}


def marked_as(path: str) -> str | None:
    """The layout ``path`` is marked as (its marker's first line); None when it has no marker or
    does not exist. Raises OSError when the marker cannot be read (a link is never followed)."""
    try:
        fd = os.open(os.path.join(path, MARKER), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        text = os.read(fd, _MAX_MARKER_BYTES)
    finally:
        os.close(fd)
    return text.decode(errors="replace").partition("\n")[0].strip()


def mark(path: str, layout: str, *, durable: bool = True) -> None:
    """Write ``path``'s marker saying it is ``layout`` (replacing any). Raises OSError."""
    write_atomic(os.path.join(path, MARKER), f"{layout}\n".encode(), mode=0o644, durable=durable)


def check(path: str, layout: str) -> str | None:
    """Refuse to use ``path`` as ``layout`` when it is marked as another one: FailedPrecondition
    with a sentence that says what it is. Unmarked or missing is fine (older roots are unmarked).
    Returns what the marker says (None: no marker)."""
    try:
        found = marked_as(path)
    except OSError as exc:
        raise error_from_oserror(exc, f"cannot read {os.path.join(path, MARKER)}") from None
    if found is None or found == layout:
        return found
    what = _NAMES.get(found, f"marked {found!r}, a layout this podshim does not know")
    hint = ""
    if layout == BUNDLE_ROOT and found == POD_ROOT:
        hint = (f"; a Controller opened on it would take podshimd's images and pods for sandboxes. podshimd's "
                f"sandboxes are in {os.path.join(path, SANDBOXES_DIR)} (podshimctl --root "
                f"{os.path.join(path, SANDBOXES_DIR)} -n k8s.io)")
    elif layout == POD_ROOT and found == BUNDLE_ROOT:
        hint = "; give podshimd a state root of its own (its sandboxes' bundles go to STATE_ROOT/sandboxes)"
    raise FailedPrecondition(f"{path} is {what}, not {_NAMES[layout]} ({os.path.join(path, MARKER)} says so); "
                             f"it is left alone{hint}")


def claim(path: str, layout: str) -> None:
    """:func:`check`, then mark ``path`` as ``layout`` if it is not marked yet (it must exist)."""
    if check(path, layout) is not None:
        return
    try:
        mark(path, layout)
    except OSError as exc:
        raise error_from_oserror(exc, f"cannot mark {path} as {_NAMES[layout]}") from None
