"""What every podshim program (podshim, podshimctl, podshimd, containerd-shim-podshim-v1) shares
about being a process: how it starts another podshim, how it ends, how it goes on running, and
the one mapping of its errors to a sentence and an exit status. Here, with what the shim shares
with its clients, because the client's programs use it too (standard library and the wire's
errors only, imported when a command runs).

- :func:`podshim_argv`: the command line that runs ``podshim`` with exactly the code and
  libraries this process runs, as ``python -I -S`` with the paths given explicitly: without
  ``site``'s start-up hooks (the .pth files of site-packages), and without the caller's
  environment (PYTHONPATH, the working directory) changing which code runs. The installed
  commands (``bin/podshim``, ``bin/podshimctl``) start the same way from their venv.
- :func:`exit_now`: how the commands end once their work is done, without the interpreter's
  finalization, which only delays the caller waiting for the exit.
- :func:`long_running`: the commands start with the cyclic garbage collector off (the boot
  programs turn it off first thing): their imports allocate many objects, none of them garbage,
  and the collector's passes over them would slow every start. A process that goes on running
  (a shim serving, the template, a podshimctl verb that waits) turns it on, after moving what it
  allocated so far to the collector's permanent generation (``gc.freeze``), so that its first
  passes do not walk the imports.
- :func:`exit_status`: what a command's body raises as one sentence on stderr and an exit status
  (:class:`UsageError` 2; :class:`Failure`, an RpcError, an OSError, a ValueError 1).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["BOOT", "CODE_PACKAGES", "Failure", "UsageError", "exit_now", "exit_status", "long_running",
           "os_error_sentence", "podshim_argv", "search_path"]

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



class UsageError(Exception):
    """Bad input from the command line: exit 2."""


class Failure(Exception):
    """A command cannot do its job; the message is one sentence for the person who ran it: exit 1."""


def exit_status(program: str, body: Callable[[], int], *failures: type[Exception]) -> int:
    """Run ``body`` and return its exit status; what it raises becomes one sentence on stderr after
    ``program:`` and a status: :class:`UsageError` 2; an RpcError (its code's name and message), an
    OSError (:func:`os_error_sentence`), a :class:`Failure`, a ValueError or one of ``failures`` 1. The one mapping of the
    project's commands (podshim, containerd-shim-podshim-v1, podshimd)."""
    from shim.rpc.status import RpcError  # here: exit_now and long_running stay cheap to import

    sentences: tuple[type[Exception], ...] = (Failure, ValueError, *failures)
    try:
        return body()
    except UsageError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        return 2
    except RpcError as exc:
        print(f"{program}: {exc.code.name}: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{program}: {os_error_sentence(exc)}", file=sys.stderr)
        return 1
    except sentences as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        return 1


def os_error_sentence(exc: OSError) -> str:
    """What an OSError says, as a sentence: not "[Errno N] ...: 'path'"."""
    said = exc.strerror or str(exc)
    if exc.filename and exc.strerror and exc.filename not in said:
        said = f"{exc.filename}: {said}"
    return said
