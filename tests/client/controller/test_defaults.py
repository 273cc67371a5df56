"""The Controller's defaults: one home for roots and timeouts, no bare timeouts elsewhere, no
import cycle among the client's modules, and systemd paths that follow the runtime root."""

from __future__ import annotations

import ast
import os

import pytest

from client.controller import defaults
from client.controller.spawners.systemd import SystemdSpawner, activation_socket_path, env_file_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CLIENT = os.path.join(ROOT, "client")
#: The modules that wait on something: every bound they use must be a name from client.controller.defaults.
WAITERS = ["controller/controller.py", "controller/loading.py", "controller/liveness.py", "controller/spawners/exec.py",
           "controller/spawners/systemd.py", "cli/main.py"]
_TIMED_CALLS = {"fail_after", "move_on_after", "sleep", "wait_for"}


def _tree(relative: str) -> ast.Module:
    with open(os.path.join(CLIENT, relative)) as f:
        return ast.parse(f.read(), relative)


def _bare_timeouts(tree: ast.Module) -> list[str]:
    """Numbers given as a ``timeout=`` argument or to a timed call, with their line."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        args = [kw.value for kw in node.keywords if kw.arg == "timeout"]
        if name in _TIMED_CALLS:
            args += node.args[:1]
        found += [f"line {a.lineno}: {ast.unparse(node)}" for a in args
                  if isinstance(a, ast.Constant) and isinstance(a.value, (int, float)) and not isinstance(a.value, bool)]
    return found


@pytest.mark.parametrize("module", WAITERS)
def test_every_timeout_is_a_named_default(module) -> None:
    assert _bare_timeouts(_tree(module)) == []


def test_the_defaults_hold_the_roots_and_every_named_timeout() -> None:
    from client.controller import controller, liveness, loading
    from client.controller.spawners import exec, systemd

    timeouts = {name for name in defaults.__all__ if name.endswith(("_TIMEOUT", "_GRACE", "_MARGIN"))}
    assert {"LOAD_TIMEOUT", "SPAWN_TIMEOUT", "CALL_TIMEOUT", "SHUTDOWN_TIMEOUT", "DELETE_TIMEOUT"} <= timeouts
    for module in (controller, loading, liveness, exec, systemd):
        for name in timeouts & set(vars(module)):
            assert getattr(module, name) is getattr(defaults, name), f"{module.__name__} redefines {name}"
    assert {"DEFAULT_BUNDLE_ROOT", "DEFAULT_RUNTIME_ROOT"} <= set(defaults.__all__)


def test_the_spawn_timeout_outlasts_the_shims_own_start_timeout() -> None:
    from shim.launch import spawn

    assert defaults.SPAWN_TIMEOUT > spawn.START_TIMEOUT


def test_a_templates_spawn_is_waited_for_longer_than_the_template_waits_for_its_shim_and_less_than_controllers() -> None:
    from shim.api.defaults import TEMPLATE_SPAWN_TIMEOUT
    from shim.launch import spawn

    assert spawn.START_TIMEOUT < TEMPLATE_SPAWN_TIMEOUT < defaults.SPAWN_TIMEOUT


def _client_imports(relative: str) -> set[str]:
    """The client modules ``relative`` imports, at any depth of the file (lazy imports count)."""
    names = set()
    for node in ast.walk(_tree(relative)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("client."):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("client.")}
    return names


def _client_modules() -> dict[str, str]:
    found = {}
    for directory, _, files in os.walk(CLIENT):
        for name in files:
            if name.endswith(".py") and "_pb2" not in name:
                relative = os.path.relpath(os.path.join(directory, name), CLIENT)
                module = "client." + relative[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = relative
    return found


def test_the_clients_modules_import_one_another_without_a_cycle() -> None:
    modules = _client_modules()
    graph = {m: {i for i in _client_imports(path) if i in modules and i != m} for m, path in modules.items()}
    # The package's __init__ re-exports from its modules; a module importing a sibling loads it
    # first. Only module-to-module edges can make a cycle.
    graph["client"] = set()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_systemd_paths_follow_the_runtime_root(tmp_path) -> None:
    other = str(tmp_path / "run")
    spawner = SystemdSpawner(str(tmp_path / "state"), other, systemctl=["false"])
    assert spawner.env_file == f"{other}/systemd.env" == env_file_path(other)
    assert activation_socket_path("ns1", "sb1", other) == f"{other}/u/ns1:sb1.sock"
    # The units of systemd/ listen in /run/podshim/u: another root starts services alone...
    assert spawner.socket_activation is False
    assert SystemdSpawner(str(tmp_path / "state"), other, socket_activation=True).socket_activation is True
    # ...and the default root keeps the units' own paths.
    default = SystemdSpawner(str(tmp_path / "state"))
    assert (default.env_file, default.socket_activation) == ("/run/podshim/systemd.env", True)
    assert activation_socket_path("ns1", "sb1") == "/run/podshim/u/ns1:sb1.sock"
