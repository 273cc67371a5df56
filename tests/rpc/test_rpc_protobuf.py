"""Protobuf payloads on the ttrpc framing (protocol.md, "Protobuf payloads"): ttrpc's own Request and
Response envelope as containerd writes it, read and written by shim.rpc.protowire (checked against
the protobuf library with the envelope described here), and one server serving a protobuf service
and a msgpack one side by side, each connection in the codec of its first request.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from shim.rpc import Client, InvalidArgument, Server, Unimplemented, protowire
from shim.rpc.codecs import MSGPACK, PROTOBUF, codec_of_request
from shim.rpc.frames import MessageType, encode_frame
from shim.rpc.messages import Request, Response, encode_request
from shim.rpc.status import Code

WAIT = 5.0


def _envelope() -> tuple[type, type]:
    """ttrpc's Request and Response (and google.rpc.Status), described field by field."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="test_ttrpc_envelope.proto", package="testttrpc", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = type_name

    one, many = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    message("KeyValue", ("key", 1, f.TYPE_STRING, one, ""), ("value", 2, f.TYPE_STRING, one, ""))
    message("Request", ("service", 1, f.TYPE_STRING, one, ""), ("method", 2, f.TYPE_STRING, one, ""),
            ("payload", 3, f.TYPE_BYTES, one, ""), ("timeout_nano", 4, f.TYPE_INT64, one, ""),
            ("metadata", 5, f.TYPE_MESSAGE, many, ".testttrpc.KeyValue"))
    message("Status", ("code", 1, f.TYPE_INT32, one, ""), ("message", 2, f.TYPE_STRING, one, ""))
    message("Response", ("status", 1, f.TYPE_MESSAGE, one, ".testttrpc.Status"), ("payload", 2, f.TYPE_BYTES, one, ""))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("testttrpc.Request")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("testttrpc.Response")))


PbRequest, PbResponse = _envelope()


def test_a_request_as_containerd_writes_it_is_read_with_its_payload_deadline_and_metadata() -> None:
    wire = PbRequest(service="containerd.task.v3.Task", method="State", payload=b"\x0a\x03abc",
                     timeout_nano=5_000_000_000,
                     metadata=[{"key": "containerd-namespace", "value": "k8s.io"},
                               {"key": "Trace", "value": "a"}, {"key": "trace", "value": "b"}]).SerializeToString()
    assert codec_of_request(wire) is PROTOBUF
    assert protowire.decode_request(wire) == Request("containerd.task.v3.Task", "State", b"\x0a\x03abc",
                                                     5_000_000_000, {"containerd-namespace": ["k8s.io"],
                                                                     "trace": ["a", "b"]})


def test_a_msgpack_request_is_told_from_a_protobuf_one_by_its_first_byte() -> None:
    assert codec_of_request(encode_request(Request("podshim.sandbox.v1.Sandbox", "PingSandbox", {}))) is MSGPACK


def test_what_protowire_writes_the_protobuf_library_reads():
    request = PbRequest.FromString(protowire.encode_request(
        Request("containerd.services.events.ttrpc.v1.Events", "Forward", b"\x01\x02", 7, {"k": ["v"]})))
    assert (request.service, request.method, request.payload, request.timeout_nano,
            [(kv.key, kv.value) for kv in request.metadata]) == (
        "containerd.services.events.ttrpc.v1.Events", "Forward", b"\x01\x02", 7, [("k", "v")])
    response = PbResponse.FromString(protowire.encode_response(Response(Code.NOT_FOUND, "task 'c1' not found")))
    assert (response.status.code, response.status.message, response.payload) == (5, "task 'c1' not found", b"")
    ok = PbResponse.FromString(protowire.encode_response(Response(payload=b"\x08\x01")))
    assert (ok.HasField("status"), ok.status.code, ok.payload) == (True, 0, b"\x08\x01")
    assert protowire.decode_response(PbResponse(status={"code": 9, "message": "no"}, payload=b"x")
                                     .SerializeToString()) == Response(9, "no", [], b"x")


@pytest.mark.parametrize("wire, sentence", [
    (b"\x0a\x05abc", "request is not valid protobuf: field 1 runs past the end"),
    (b"\x0a\x01s\x12", "request is not valid protobuf: a varint is cut short"),
    (b"\x0a\x01s", "request field 'method' must be a non-empty string"),
    (b"\x0a\x02\xff\xfe\x12\x01m", "request field 'service' is not UTF-8"),
    (b"\x0a\x01s\x12\x01m\x20\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "request field 'timeout_nano' must be a "
     "non-negative integer"),
])
def test_a_malformed_request_is_refused_with_a_sentence(wire, sentence) -> None:
    with pytest.raises(InvalidArgument) as refused:
        protowire.decode_request(wire)
    assert refused.value.message == sentence


# -- one server, both codecs ---------------------------------------------------------------------

PB_SERVICE = "test.v1.Proto"
MP_SERVICE = "test.v1.Msgpack"


@pytest.fixture
async def served():
    """A server with a protobuf service (it answers the bytes it got, reversed) and a msgpack one."""
    async def reverse(ctx, payload):
        assert ctx.request.metadata.get("containerd-namespace") == ["ns1"]
        return payload[::-1]

    async def echo(ctx, payload):
        return payload

    server = Server()
    server.register(PB_SERVICE, unary={"Reverse": reverse}, protobuf=True)
    server.register(MP_SERVICE, unary={"Echo": echo})
    with tempfile.TemporaryDirectory(prefix="podshim-pb-") as directory:
        path = os.path.join(directory, "s.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen()
        await server.start(sock)
        try:
            yield f"unix://{path}"
        finally:
            await server.aclose()


async def test_one_server_answers_protobuf_and_msgpack_connections_each_in_its_own_codec(served) -> None:
    async with await Client.connect(served, codec=PROTOBUF) as pb, await Client.connect(served) as mp:
        got = await asyncio.wait_for(pb.call(PB_SERVICE, "Reverse", b"\x01\x02\x03",
                                             metadata={"containerd-namespace": ["ns1"]}), WAIT)
        assert got == b"\x03\x02\x01"
        assert await asyncio.wait_for(mp.call(MP_SERVICE, "Echo", {"a": 1}), WAIT) == {"a": 1}


async def test_a_service_is_not_served_in_the_other_codec(served) -> None:
    async with await Client.connect(served, codec=PROTOBUF) as pb, await Client.connect(served) as mp:
        with pytest.raises(Unimplemented, match=f"unknown method /{MP_SERVICE}/Echo"):
            await asyncio.wait_for(pb.call(MP_SERVICE, "Echo", b""), WAIT)
        with pytest.raises(Unimplemented, match=f"unknown method /{PB_SERVICE}/Reverse"):
            await asyncio.wait_for(mp.call(PB_SERVICE, "Reverse", {}), WAIT)


async def test_a_malformed_protobuf_request_fails_its_stream_in_protobuf_and_the_connection_goes_on(served):
    reader, writer = await asyncio.open_unix_connection(served.removeprefix("unix://"))
    try:
        good = protowire.encode_request(Request(PB_SERVICE, "Reverse", b"ab", 0, {"containerd-namespace": ["ns1"]}))
        writer.write(encode_frame(1, MessageType.REQUEST, 0, good) + encode_frame(3, MessageType.REQUEST, 0, b"\x0a\x01s"))
        answers = {}
        data = b""
        while len(answers) < 2:
            chunk = await asyncio.wait_for(reader.read(65536), WAIT)
            assert chunk, "the server closed the connection"
            data += chunk
            while len(data) >= 10 and len(data) >= 10 + int.from_bytes(data[:4], "big"):
                length, sid = int.from_bytes(data[:4], "big"), int.from_bytes(data[4:8], "big")
                answers[sid] = protowire.decode_response(data[10:10 + length])
                data = data[10 + length:]
        assert answers == {1: Response(payload=b"ba"),
                           3: Response(Code.INVALID_ARGUMENT, "request field 'method' must be a non-empty string",
                                       [], b"")}
    finally:
        writer.close()
