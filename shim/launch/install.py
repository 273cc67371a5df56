"""The installed code, as a process that starts another podshim process sees it.

- :func:`podshim_argv`: the command line that runs ``podshim`` with exactly the code and
  libraries this process runs, as ``python -I -S`` with the paths given explicitly. A console
  script starts Python with ``site``, which runs every start-up hook of site-packages (.pth files:
  30-40 ms per process on a node, a third of what a shim costs to start); ``-I`` also keeps the
  caller's environment (PYTHONPATH, the working directory) from changing which code runs. The
  installed commands (``bin/podshim``, ``bin/podshimctl``) start the same way from their venv.
- :func:`exit_now`: how the commands end once their work is done, without the interpreter's
  finalization (tens of milliseconds once asyncio is loaded, 80 with gRPC) that only delays the
  caller waiting for the exit.
- :func:`long_running`: the commands start with the cyclic garbage collector off (the boot
  programs turn it off first thing): their imports allocate a few hundred thousand objects, none
  of them garbage, and the collector's passes over them cost 5 % of a shim's start. A process
  that goes on running (a shim serving, the template, a podshimctl verb that waits) turns it on,
  after moving what it allocated so far to the collector's permanent generation (``gc.freeze``):
  turned on over them, its first passes (tens of thousands of objects, still in the youngest
  generation) ran before the shim served, 3-15 ms of an exec'd shim's start.
- :func:`code_files` and :func:`fingerprint`: the files of the podshim code a long-lived process
  (the template) loaded, and what is on disk at those paths now, so the process can tell the
  installed package changed under it.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

__all__ = ["BOOT", "CODE_PACKAGES", "code_files", "exit_now", "fingerprint", "long_running", "podshim_argv",
           "search_path"]

#: The top-level packages whose code a shim runs besides the standard library.
CODE_PACKAGES = ("shim", "msgpack", "uvloop")
#: Where a shim may import from: those, and pyroute2 (loaded only to describe a netns on request).
_PATH_PACKAGES = (*CODE_PACKAGES, "pyroute2")
#: The program ``python -I -S -c`` runs: its first argument is the search path (``:``-separated,
#: appended after the standard library so nothing installed can shadow it), the rest is podshim's.
#: It names itself ``podshim`` in argv[0] so ``ps`` and the test suite's leak guard see what it is.
BOOT = ("import gc; gc.disable(); import sys; sys.argv[0] = 'podshim'; sys.path += sys.argv.pop(1).split(':'); "
        "from shim.cli import run; run()")


def search_path() -> list[str]:
    """The directories this process imports podshim's code and libraries from: the one holding
    the ``shim`` package (site-packages, or the checkout of an editable install or a PYTHONPATH),
    then those of msgpack, uvloop and pyroute2, without repeats."""
    import importlib.util

    found: list[str] = []
    for name in _PATH_PACKAGES:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None)
        if origin is None:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
        if origin is None:
            continue  # uvloop is optional: the shim runs on asyncio's own loop without it
        directory = os.path.dirname(os.path.dirname(os.path.abspath(origin)))
        if directory not in found:
            found.append(directory)
    return found


def podshim_argv(python: str | None = None) -> list[str]:
    """``podshim`` as this process would run it: ``[python, -I, -S, -c, BOOT, PATH]``, to which
    the caller adds the action and its arguments. ``python`` defaults to this interpreter."""
    path = search_path()
    if any(":" in p for p in path):
        raise ValueError(f"cannot pass the search path {path!r} on a command line: a directory has a ':'")
    return [python or sys.executable, "-I", "-S", "-c", BOOT, ":".join(path)]


def exit_now(code: int) -> NoReturn:
    """End a command with exit status ``code`` at once: flush stdout and stderr, then _exit.

    A command's work is done and its output written when its main() returns; what the
    interpreter would still do (atexit hooks, tearing down every module and object, gRPC's
    threads) changes nothing anyone sees and costs the caller, who waits for the exit, tens of
    milliseconds. Only for the programs' entry points: code that calls main() keeps its process.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (| head), a closed stream: nothing to keep
            pass
    os._exit(code)


def long_running() -> None:
    """This process goes on running: freeze what it allocated so far (its imports: never
    garbage) and turn the cyclic garbage collector back on (see above)."""
    import gc

    gc.freeze()
    gc.enable()


def code_files() -> list[str]:
    """The source files of every module of :data:`CODE_PACKAGES` this process has loaded, sorted."""
    files = set()
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in CODE_PACKAGES:
            origin = getattr(module, "__file__", None)
            if origin:
                files.add(os.path.abspath(origin))
    return sorted(files)


def fingerprint(files: list[str]) -> tuple:
    """What is at ``files`` now: each one's inode, size and modification time (or why it cannot
    be read), to compare with an earlier fingerprint. An upgrade or an edit of any of them
    changes it; it costs a stat per file, a fraction of a millisecond for a shim's modules."""
    state: list = []
    for path in files:
        try:
            st = os.stat(path)
        except OSError as exc:
            state.append(exc.errno)
        else:
            state.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(state)
