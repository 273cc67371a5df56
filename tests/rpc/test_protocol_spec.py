"""protocol.md is normative: its constants, code table, methods and test vectors match the code."""

import pathlib
import re

import pytest

from shim.api import names as api
from shim.rpc import frames
from shim.rpc.connection import MAX_ACTIVE_STREAMS
from shim.rpc.frames import FrameDecoder, encode_frame
from shim.rpc.messages import (
    MAX_METADATA_ENTRIES,
    MAX_METADATA_VALUES,
    NAMESPACE_KEY,
    decode_request,
    decode_response,
    unpack,
)
from shim.rpc.status import Code

SPEC = (pathlib.Path(__file__).parent.parent.parent / "protocol.md").read_text()


def spec_constant(name: str) -> int:
    m = re.search(rf"^\| `{name}` \| (\d+) \|", SPEC, re.M)
    assert m, f"protocol.md does not state {name}"
    return int(m.group(1))


def test_framing_constants_match_the_spec() -> None:
    assert spec_constant("HEADER_BYTES") == frames.HEADER_BYTES == 10
    assert spec_constant("MAX_DATA_BYTES") == frames.MAX_DATA_BYTES
    assert spec_constant("MAX_LENGTH_FIELD") == frames.MAX_LENGTH_FIELD


def test_message_types_and_flags_match_the_spec() -> None:
    for value, name in re.findall(r"^\| `0x0(\d)` \| (request|response|data) \|", SPEC, re.M):
        assert frames.MessageType[name.upper()] == int(value)
    for value, name in re.findall(r"^\| `0x0(\d)` \| (remote-closed|remote-open|no-data) \|", SPEC, re.M):
        assert frames.Flags[name.upper().replace("-", "_")] == int(value)


def test_status_code_table_matches_the_enum() -> None:
    pairs = re.findall(r"(?<=\| )(\d+) \| ([A-Z_]+)(?= \|)", SPEC)
    assert len({int(n) for n, _ in pairs}) == 17
    for number, name in pairs:
        assert Code[name] == int(number)


def test_limits_stated_in_the_spec_match_the_code() -> None:
    assert f"at most {MAX_METADATA_ENTRIES} keys and {MAX_METADATA_VALUES} values per key" in SPEC
    assert f"more than {MAX_ACTIVE_STREAMS} streams open at once" in SPEC
    from shim.rpc import server

    assert f"at most **{server.MAX_CONNECTIONS} connections** at once" in SPEC
    assert f"closed after {server.REFUSED_LINGER:g} s without a byte" in SPEC
    assert f"beyond {server.MAX_REFUSED} waiting at once" in SPEC
    assert f"`{NAMESPACE_KEY}`" in SPEC


def test_every_method_is_specified() -> None:
    for service, methods in ((api.SANDBOX_SERVICE, api.SANDBOX_METHODS), (api.EVENTS_SERVICE, api.EVENTS_METHODS),
                             (api.TASK_SERVICE, api.TASK_METHODS), (api.TEMPLATE_SERVICE, api.TEMPLATE_METHODS)):
        assert f"`{service}`" in SPEC
        for method in methods:
            assert f"| `{method}` |" in SPEC, method


def test_task_constants_match_the_spec() -> None:
    from shim.runtime.crilog import LOG_DIR_MODE, MAX_LINE_BYTES
    from shim.runtime.process import DEFAULT_PATH

    text = " ".join(SPEC.split())
    assert f"longer than {MAX_LINE_BYTES} bytes is cut into records of {MAX_LINE_BYTES} bytes" in text
    assert f"`PATH` defaults to `{DEFAULT_PATH}`" in text
    assert f"makes the directories of `log_path` (mode `{LOG_DIR_MODE:04o}`)" in text


def test_the_wait_for_an_output_fifos_reader_matches_the_spec() -> None:
    from shim.api.defaults import FIFO_READER_WAIT

    text = " ".join(SPEC.split())
    stated = re.findall(r"`FIFO_READER_WAIT` \(([\d.]+) s\)", text)
    assert len(stated) == 2, "protocol.md states FIFO_READER_WAIT at ExecStart and at AttachOutput"
    assert {float(figure) for figure in stated} == {FIFO_READER_WAIT}


def table_keys(section: str) -> set[str]:
    """The backquoted keys in the first column of the tables of ``section``."""
    return {key for row in re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", section, re.M) for key in row if key}


def test_exec_limits_resources_and_metric_figures_match_the_spec() -> None:
    from shim.kernel.cgroups import METRIC_KEYS, UPDATE_KEYS
    from shim.runtime.execsync import EXEC_DRAIN_SECS, EXEC_OUTPUT_LIMIT_BYTES

    text = " ".join(SPEC.split())
    assert f"`EXEC_OUTPUT_LIMIT_BYTES` ({EXEC_OUTPUT_LIMIT_BYTES})" in text
    assert f"`EXEC_DRAIN_SECS` ({EXEC_DRAIN_SECS:g})" in text
    assert table_keys(SPEC[SPEC.index("**Update**"):SPEC.index("**ReopenLog**")]) == set(UPDATE_KEYS)
    assert table_keys(SPEC[SPEC.index("**SandboxMetrics** `data`"):SPEC.index("**ShutdownSandbox**")]) == \
        set(METRIC_KEYS)


def test_each_resource_is_written_to_the_v1_file_the_spec_names() -> None:
    from shim.kernel.cgroups import RESOURCE_FILES

    update = SPEC[SPEC.index("**Update**"):SPEC.index("**ReopenLog**")]
    for key, (_, name, *_) in RESOURCE_FILES.items():
        row = next(line for line in update.splitlines() if re.match(rf"^\| (`\w+`, )?`{key}`", line))
        assert f"`{name.replace('{size}', '<page size>')}`" in row, key


VECTORS = dict(re.findall(r"^vector ([a-z-]+): ([0-9a-f]+)$", SPEC, re.M))


def decode_one(raw: bytes) -> frames.Frame:
    d = FrameDecoder()
    d.feed(raw)
    frame = d.next_event()
    assert d.next_event() is frames.NEED_DATA
    assert isinstance(frame, frames.Frame)
    return frame


def test_spec_has_the_vectors() -> None:
    assert set(VECTORS) == {"ping-request", "ok-response", "not-found-response", "event-data"}


def test_ping_request_vector() -> None:
    raw = bytes.fromhex(VECTORS["ping-request"])
    frame = decode_one(raw)
    assert (frame.stream_id, frame.type, frame.flags) == (1, 1, 0)
    req = decode_request(frame.data)
    assert (req.service, req.method, req.payload, req.timeout_nano) == (api.SANDBOX_SERVICE, "PingSandbox",
                                                                         {"sandbox_id": "sb1"}, 0)
    assert req.namespace == "default"
    from shim.rpc.messages import encode_request
    assert encode_frame(1, 1, 0, encode_request(req)) == raw


@pytest.mark.parametrize("name,stream_id,code", [("ok-response", 1, 0), ("not-found-response", 3, 5)])
def test_response_vectors(name, stream_id, code) -> None:
    from shim.rpc.messages import encode_response
    raw = bytes.fromhex(VECTORS[name])
    frame = decode_one(raw)
    assert (frame.stream_id, frame.type) == (stream_id, 2)
    resp = decode_response(frame.data)
    assert resp.code == code
    assert encode_frame(stream_id, 2, 0, encode_response(resp)) == raw


def test_event_data_vector() -> None:
    frame = decode_one(bytes.fromhex(VECTORS["event-data"]))
    assert (frame.stream_id, frame.type) == (5, 3)
    assert unpack(frame.data) == {"topic": "/sandbox/exit"}


def test_confinement_defaults_and_seccomp_vocabulary_match_the_spec() -> None:
    from shim.api.defaults import DEFAULT_CAPABILITIES
    from shim.kernel import seccomp

    row = next(line for line in SPEC.splitlines() if line.startswith("| `capabilities` | array of `CAP_*` names"))
    assert f"`{' '.join(DEFAULT_CAPABILITIES)}`" in row
    for name in (*seccomp.ACTIONS, *seccomp.FLAGS):
        short = name.removeprefix("SECCOMP_FILTER_FLAG")
        assert f"`{name}`" in SPEC or f"`{short}`" in SPEC, name
    for op in seccomp.OPERATORS:
        assert f"`{op}`" in SPEC or f"`{op.removeprefix('SCMP_CMP')}`" in SPEC, op
