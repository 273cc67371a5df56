"""Task.Create's ``hooks``: checked as the OCI hooks they are, said in config.json as the runtime
specification says them (the points, argv, env, timeout)."""

from __future__ import annotations

import pytest

from shim.rpc.status import InvalidArgument
from shim.runtime.hooks import DEFAULT_TIMEOUT, Hook, oci_hooks, parse_hooks


def test_hooks_are_said_in_config_json_by_their_points_in_order() -> None:
    hooks = parse_hooks({"hooks": [
        {"hook_name": "createContainer", "path": "/usr/bin/a", "args": ["a", "-x"], "env": ["K=v"], "timeout": 5},
        {"hook_name": "poststop", "path": "/usr/bin/b"},
        {"hook_name": "createContainer", "path": "/usr/bin/c"}]})
    assert hooks[0] == Hook("createContainer", "/usr/bin/a", ("a", "-x"), ("K=v",), 5)
    assert oci_hooks(hooks) == {
        "createContainer": [{"path": "/usr/bin/a", "args": ["a", "-x"], "env": ["K=v"], "timeout": 5},
                            {"path": "/usr/bin/c", "args": ["/usr/bin/c"], "timeout": DEFAULT_TIMEOUT}],
        "poststop": [{"path": "/usr/bin/b", "args": ["/usr/bin/b"], "timeout": DEFAULT_TIMEOUT}]}
    assert hooks[1].environment({"PATH": "/bin"}) == {"PATH": "/bin"}  # none said: the runner's
    assert hooks[0].environment({"PATH": "/bin"}) == {"K": "v"}  # said: all of it


@pytest.mark.parametrize(("entry", "message"), [
    ({"hook_name": "atLunch", "path": "/x"}, "field 'hooks[0].hook_name' must be one of prestart, "),
    ({"hook_name": "poststart", "path": "x"}, "field 'hooks[0].path' must be an absolute path"),
    ({"hook_name": "poststart", "path": "/x", "args": "x"}, "field 'hooks[0].args' must be an array of strings"),
    ({"hook_name": "poststart", "path": "/x", "env": ["=v"]}, "field 'hooks[0].env' must be NAME=VALUE strings"),
    ({"hook_name": "poststart", "path": "/x", "timeout": 0}, "field 'hooks[0].timeout' must be a positive number"),
])
def test_a_malformed_hook_is_invalid_argument_naming_the_field(entry, message) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_hooks({"hooks": [entry]})
    assert message in raised.value.message


@pytest.mark.parametrize("words", [
    "runc create failed: unable to start container process: error during container init: error running hook #0: "
    "error running hook: exit status 3, stdout: , stderr: no gpu here",
    "error executing hook `/usr/bin/x` (exit code: 3)",
    "timeout expired for `/usr/bin/x`",
])
def test_a_hook_failing_under_an_oci_runtime_is_failed_precondition_in_its_words(words) -> None:
    from shim.rpc.status import FailedPrecondition
    from shim.runtime.oci import cli

    error = cli._failure("runc create c", "create", 1, [words])
    assert isinstance(error, FailedPrecondition)
    assert error.message == f"runc create c failed: {words}"
