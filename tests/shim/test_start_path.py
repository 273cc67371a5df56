"""What ``podshim start`` (the exec path) imports before its shim serves (issue #15: start-up
within 100 ms). Modules that only some calls use load on their first use, not at start-up; this
keeps them out of start-up for good. Measured on the real command, the way the Controller runs
it: ``python -X importtime`` lists every import of ``start`` (stderr) and of the shim it forks
(its log), up to the moment the shim says it serves and ``start`` prints its address."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from shim.api.paths import LOG_FILE
from shim.lib.program import podshim_argv

from support.shimtools import (
    WAIT,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
    new_id,
)

#: Loaded on first use only, never to start a shim (what each is for).
LAZY = {
    "dataclasses": "@dataclass compiles its classes' methods in every process: records are shim.rpc.records",
    "shim.runtime.pause": "StartSandbox",
    "shim.runtime.process": "StartSandbox and the Task service",
    "shim.runtime.mounts": "StartSandbox and Task.Create",
    "shim.runtime.confine": "a confinement in CreateSandbox or Task.Create",
    "shim.runtime.native": "CreateSandbox",
    "shim.runtime.oci": "the runc and crun handlers",
    "shim.kernel.seccomp": "a seccomp filter",
    "shim.kernel.capabilities": "a task's capabilities",
    "shim.sandbox.tasks": "the Task service",
    "shim.rpc.blocking": "a template or a stale socket",
    "pyroute2": "describing a netns on request",
    "ctypes.util": "finding libseccomp by other than its name",
    "shutil": "argparse's help width: shim.lib.arguments asks the terminal itself",
    "tempfile": "never on the start path",
    "platform": "never on the start path",
}
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.M)


def _imports(text: str) -> set[str]:
    return set(_IMPORTED.findall(text))


def _lazy_loaded(modules: set[str]) -> dict[str, str]:
    return {m: why for lazy, why in LAZY.items() for m in modules if m == lazy or m.startswith(lazy + ".")}


@pytest.fixture
async def started(shims):
    """Every module ``podshim start --no-template`` and its shim imported until it served."""
    bundle, runtime_root = shims.directories()
    sandbox_id = new_id()
    python, *boot = podshim_argv()
    argv = [python, "-X", "importtime", *boot, "start", "--namespace", "it", "--id", sandbox_id, "--bundle", bundle,
            "--runtime-root", runtime_root, "--no-template"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT * 2)
    assert done.returncode == 0, done.stderr
    shims.adopt("it", sandbox_id, bundle, runtime_root, json.loads(done.stdout))
    with open(os.path.join(bundle, LOG_FILE)) as f:
        shim_log = f.read()
    assert "serving sandbox" in shim_log
    # Up to "serving": the shim imports nothing more until a call comes.
    return _imports(done.stderr), _imports(shim_log.split("serving sandbox")[0])


async def test_start_and_its_shim_import_no_module_that_only_some_calls_use(started) -> None:
    start, shim = started
    assert "shim.daemon" in start | shim  # the measurement sees the shim's imports
    assert _lazy_loaded(start) == {}
    assert _lazy_loaded(shim) == {}
