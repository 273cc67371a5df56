"""podshimctl: the sandbox verbs through a subprocess (``--json`` parsed), raw calls and events,
and bad input: a clear sentence and exit 1 (usage: 2), never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from client.cli import main as cli

from support.proctools import alive
from support.sandbox_env import PODSHIMCTL

NS = "default"
SANDBOX = "podshim.sandbox.v1.Sandbox"


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result


def as_json(result: subprocess.CompletedProcess):
    return json.loads(ok(result).stdout)


def run_main(env, capsys, *argv: str) -> tuple[int, str, str]:
    """podshimctl in-process (fast), over the test's roots."""
    code = cli.main(["--root", env.state_root, "--runtime-root", env.runtime_root, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_sandbox_lifecycle_through_podshimctl(env) -> None:
    sid = env.sid("cli")
    assert as_json(env.ctl("sandbox", "create", sid, "--json")) == {"namespace": NS, "sandbox_id": sid}
    started = as_json(env.ctl("sandbox", "start", sid, "--json"))
    assert started["sandbox_id"] == sid and alive(started["pid"]) and started["version"] == 3
    status = as_json(env.ctl("--json", "sandbox", "status", sid, "--verbose"))
    assert (status["state"], status["pid"]) == ("running", started["pid"]) and status["info"]["netns_path"]
    listed = as_json(env.ctl("sandbox", "list", "--json"))
    assert [(s["sandbox_id"], s["state"]) for s in listed] == [(sid, "running")]
    assert as_json(env.ctl("sandbox", "platform", sid, "--json"))["os"] == "linux"
    assert as_json(env.ctl("sandbox", "metrics", sid, "--json"))["data"]["pids_current"] == 1
    table = ok(env.ctl("sandbox", "list", "--all-namespaces")).stdout.splitlines()
    assert table[0].split() == ["NAMESPACE", "SANDBOX", "ID", "STATE", "PID", "CREATED", "AT", "EXIT", "STATUS"]
    assert table[1].split()[:3] == [NS, sid, "running"]
    ok(env.ctl("sandbox", "stop", sid, "--timeout", "1"))
    exited = as_json(env.ctl("sandbox", "wait", sid, "--json"))
    assert exited["exited_at"] > 0 and not alive(started["pid"])
    assert as_json(env.ctl("sandbox", "status", sid, "--json"))["state"] == "stopped"
    assert "shut down" in ok(env.ctl("sandbox", "shutdown", sid)).stdout
    gone = env.ctl("sandbox", "status", sid)
    assert gone.returncode == 1 and gone.stderr.startswith("NOT_FOUND: ") and "Traceback" not in gone.stderr
    assert not os.path.exists(status["info"]["netns_path"])


def test_raw_call_prints_the_payload_and_errors_name_their_status(env) -> None:
    sid = env.sid("raw")
    ok(env.ctl("sandbox", "create", sid))
    try:
        address = as_json(env.ctl("sandbox", "status", sid, "--json"))["address"]
        assert as_json(env.ctl("--address", address, "call", SANDBOX, "PingSandbox", json.dumps({"sandbox_id": sid}))) == {}
        reply = as_json(env.ctl("--address", address, "call", SANDBOX, "SandboxStatus", "-",
                                input=json.dumps({"sandbox_id": sid})))
        assert reply["state"] == "created"
        for args, status in ((["PingSandbox", '{"sandbox_id": "someone-else"}'], "NOT_FOUND"),
                             (["Frobnicate", "{}"], "UNIMPLEMENTED")):
            failed = env.ctl("--address", address, "call", SANDBOX, *args)
            assert failed.returncode == 1 and failed.stderr.startswith(status + ": "), failed.stderr
    finally:
        ok(env.ctl("sandbox", "shutdown", sid))


def test_events_prints_json_lines_until_interrupted(env):
    sid = env.sid("events")
    ok(env.ctl("sandbox", "create", sid))
    ok(env.ctl("sandbox", "start", sid))
    address = as_json(env.ctl("sandbox", "status", sid, "--json"))["address"]
    events = subprocess.Popen([*PODSHIMCTL, "--address", address, "events"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        # The subscription is live once a call behind it on the same shim was answered; the
        # stop below publishes /sandbox/exit, which the subscriber must see.
        ok(env.ctl("--address", address, "call", SANDBOX, "PingSandbox", json.dumps({"sandbox_id": sid})))
        ok(env.ctl("sandbox", "stop", sid, "--timeout", "0"))
        topics = []
        for line in events.stdout:
            event = json.loads(line)
            topics.append(event["topic"])
            if event["topic"] == "/sandbox/exit":
                assert event["sandbox_id"] == sid and event["namespace"] == NS
                break
        assert "/sandbox/exit" in topics
        events.send_signal(signal.SIGINT)
        assert events.wait(timeout=10) == 0
        assert "Traceback" not in events.stderr.read()
    finally:
        if events.poll() is None:
            events.kill()
            events.wait()
        events.stdout.close()
        events.stderr.close()
        ok(env.ctl("sandbox", "shutdown", sid))


def test_help_works_everywhere(env, capsys) -> None:
    for argv in (["--help"], ["sandbox", "--help"], ["call", "--help"], ["events", "--help"],
                 *(["sandbox", verb, "--help"] for verb in
                   ("create", "start", "stop", "wait", "status", "shutdown", "metrics", "platform", "list"))):
        code, out, _ = run_main(env, capsys, *argv)
        assert code == 0 and out.startswith("usage: podshimctl"), argv


@pytest.mark.parametrize("argv, code, said", [
    (["sandbox", "create", "a/b"], 1, "INVALID_ARGUMENT: sandbox id 'a/b' is not valid"),
    (["--namespace", "bad ns", "sandbox", "list"], 1, "INVALID_ARGUMENT: namespace"),
    (["sandbox", "status", "nobody"], 1, "NOT_FOUND: sandbox nobody not found in namespace default"),
    (["sandbox", "start", "nobody"], 1, "NOT_FOUND: "),
    (["sandbox", "stop", "nobody"], 1, "NOT_FOUND: "),
    (["sandbox", "create", "x", "--options", "/nonexistent.json"], 1, "cannot read --options /nonexistent.json"),
    (["sandbox", "create", "x", "--options", "@bad.json"], 1, "is not valid JSON"),
    (["sandbox", "create", "x", "--options", "@array.json"], 1, "must hold a JSON object"),
    (["sandbox", "create", "x", "--options", "@latin1.json"], 1, "latin1.json is not UTF-8 text (byte 0xe9 at offset 10)"),
    (["sandbox", "create", "x", "--options", "@deep.json"], 1, "deep.json is not valid JSON: it is nested more than"),
    (["sandbox", "create", "x", "--annotation", "novalue"], 1, "is not KEY=VALUE"),
    (["--address", "unix:///nonexistent/sock", "call", SANDBOX, "PingSandbox"], 1, "UNAVAILABLE: cannot connect"),
    (["--address", "unix:///nonexistent/sock", "call", SANDBOX, "PingSandbox", "{nope"], 1, "is not valid JSON"),
    (["--address", "unix:///nonexistent/sock", "call", SANDBOX, "PingSandbox", "[1]"], 1, "must be a JSON object"),
    (["--address", "unix:///nonexistent/sock", "call", SANDBOX, "PingSandbox", "[" * 100_000], 1, "nested more than"),
    (["--address", "tcp://host:1", "call", SANDBOX, "PingSandbox"], 1, "INVALID_ARGUMENT: address"),
    (["call", SANDBOX, "PingSandbox"], 2, "--address is required"),
    (["sandbox", "stop", "x", "--timeout", "soon"], 2, "invalid float value"),
    (["sandbox"], 2, "required"),
    (["frobnicate"], 2, "unknown command 'frobnicate'"),
])
def test_bad_input_gets_a_sentence_and_an_exit_status_never_a_traceback(env, capsys, tmp_path, argv, code, said) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "array.json").write_text("[1, 2]")
    (tmp_path / "latin1.json").write_bytes('{"name": "\xe9t\xe9"}'.encode("latin-1"))
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    argv = [str(tmp_path / a[1:]) if a.startswith("@") else a for a in argv]
    got, _, err = run_main(env, capsys, *argv)
    assert got == code and said in err and "Traceback" not in err, err
    assert code == 2 or err.count("\n") == 1, err  # a failure is one sentence; a usage error adds the usage
    assert os.listdir(env.state_root) in ([], [NS])  # nothing was created


def test_bad_input_through_the_real_binary_has_no_traceback(env) -> None:
    failed = env.ctl("sandbox", "status", "no/such")
    assert failed.returncode == 1 and failed.stderr == (
        "INVALID_ARGUMENT: sandbox id 'no/such' is not valid: use letters and digits joined by single '.', '_' or '-'\n")
    usage = env.ctl("sandbox", "create")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


def test_other_modules_can_register_commands(env, capsys, monkeypatch) -> None:
    monkeypatch.setattr(cli, "_COMMANDS", dict(cli._COMMANDS))

    async def hello(args):
        print(f"hello from {args.namespace}")
        return 0

    @cli.command("hello", help="say hello")
    def setup(parser):
        parser.set_defaults(run=hello)

    assert run_main(env, capsys, "--namespace", "k8s.io", "hello")[:2] == (0, "hello from k8s.io\n")
