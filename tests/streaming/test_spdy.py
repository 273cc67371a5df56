"""The SPDY/3.1 codec and connection, at the byte level, with no sockets (client/streaming/spdy.py)."""

from __future__ import annotations

import struct
import zlib

import pytest

from client.streaming import spdy
from client.streaming.spdy import (
    NEED_DATA,
    Connection,
    Data,
    DataReceived,
    FrameDecoder,
    GoAway,
    GoAwayReceived,
    HeaderCompressor,
    HeaderDecompressor,
    Ping,
    PingAcknowledged,
    PingReceived,
    RemoteProtocolError,
    RstStatus,
    RstStream,
    Settings,
    StreamOpened,
    StreamReplied,
    StreamReset,
    SynReply,
    SynStream,
    WindowUpdate,
    WindowUpdated,
    encode_frame,
)


def pair(**kwargs) -> tuple[Connection, Connection]:
    return Connection(client_side=True, **kwargs), Connection(client_side=False, **kwargs)


def pump(source: Connection, sink: Connection) -> list:
    """Move what ``source`` queued into ``sink``; return ``sink``'s events."""
    return sink.receive_data(source.data_to_send())


def decode_all(data: bytes) -> list:
    decoder = FrameDecoder()
    decoder.feed(data)
    frames = []
    while (frame := decoder.next_frame()) is not NEED_DATA:
        frames.append(frame)
    return frames


# -- the dictionary and header blocks ------------------------------------------------------------------

def test_header_dictionary_is_spdy3s_by_length_and_adler32() -> None:
    # The Adler-32 of the preset dictionary is what a zlib stream names in its header (FDICT).
    assert len(spdy.HEADER_DICTIONARY) == 1423
    assert zlib.adler32(spdy.HEADER_DICTIONARY) == 0xE3C6A7C2
    assert spdy.HEADER_DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert spdy.HEADER_DICTIONARY.endswith(b"charset=utf-8charset=iso-8859-1,utf-,*,enq=0.")


def test_header_block_is_count_then_length_prefixed_pairs_in_a_dictionary_zlib_stream() -> None:
    block = HeaderCompressor().compress([("streamType", "error"), ("port", "80")])
    assert block[2:6] == struct.pack(">I", 0xE3C6A7C2)  # zlib header with FDICT, then the dictionary id
    plain = zlib.decompressobj(zdict=spdy.HEADER_DICTIONARY).decompress(block)
    assert plain == (b"\x00\x00\x00\x02" b"\x00\x00\x00\x0astreamtype" b"\x00\x00\x00\x05error"
                     b"\x00\x00\x00\x04port" b"\x00\x00\x00\x0280")


def test_header_blocks_share_one_zlib_context_per_direction() -> None:
    compressor, decompressor = HeaderCompressor(), HeaderDecompressor()
    first = compressor.compress([("streamtype", "stdout")])
    second = compressor.compress([("streamtype", "stdout")])
    assert len(second) < len(first)  # the second refers back into the first
    assert decompressor.decompress(first) == (("streamtype", "stdout"),)
    assert decompressor.decompress(second) == (("streamtype", "stdout"),)
    with pytest.raises(RemoteProtocolError):
        HeaderDecompressor().decompress(second)  # a fresh context cannot read a continuation


def test_repeated_header_names_travel_as_one_nul_joined_value() -> None:
    block = HeaderCompressor().compress([("x-a", "1"), ("x-a", "2")])
    assert b"\x00\x00\x00\x031\x002" in zlib.decompressobj(zdict=spdy.HEADER_DICTIONARY).decompress(block)
    assert HeaderDecompressor().decompress(block) == (("x-a", "1"), ("x-a", "2"))


def test_a_header_block_that_inflates_beyond_the_limit_is_refused() -> None:
    huge = HeaderCompressor().compress([("x", "a" * 100_000)])
    with pytest.raises(RemoteProtocolError, match="inflates beyond"):
        HeaderDecompressor(max_bytes=10_000).decompress(huge)


def test_upper_case_header_names_from_the_peer_are_refused() -> None:
    z = zlib.compressobj(zdict=spdy.HEADER_DICTIONARY)
    block = z.compress(b"\x00\x00\x00\x01\x00\x00\x00\x01X\x00\x00\x00\x01y") + z.flush(zlib.Z_SYNC_FLUSH)
    with pytest.raises(RemoteProtocolError, match="not lower case"):
        HeaderDecompressor().decompress(block)


# -- frames --------------------------------------------------------------------------------------------

def test_data_frame_bytes() -> None:
    assert encode_frame(Data(5, b"hi", fin=True), HeaderCompressor()) == b"\x00\x00\x00\x05\x01\x00\x00\x02hi"


@pytest.mark.parametrize("frame, wire", [
    (RstStream(3, RstStatus.CANCEL), b"\x80\x03\x00\x03\x00\x00\x00\x08\x00\x00\x00\x03\x00\x00\x00\x05"),
    (Ping(7), b"\x80\x03\x00\x06\x00\x00\x00\x04\x00\x00\x00\x07"),
    (GoAway(9, 0), b"\x80\x03\x00\x07\x00\x00\x00\x08\x00\x00\x00\x09\x00\x00\x00\x00"),
    (WindowUpdate(1, 65536), b"\x80\x03\x00\x09\x00\x00\x00\x08\x00\x00\x00\x01\x00\x01\x00\x00"),
    (Settings({7: (0, 1 << 20)}), b"\x80\x03\x00\x04\x00\x00\x00\x0c\x00\x00\x00\x01\x00\x00\x00\x07\x00\x10\x00\x00"),
])
def test_control_frame_bytes_and_back(frame, wire) -> None:
    assert encode_frame(frame, HeaderCompressor()) == wire
    assert decode_all(wire) == [frame]


def test_syn_stream_layout_and_round_trip() -> None:
    wire = encode_frame(SynStream(1, (("streamtype", "error"),), fin=True, priority=3), HeaderCompressor())
    assert wire[:4] == b"\x80\x03\x00\x01"
    assert wire[4] == spdy.FLAG_FIN and int.from_bytes(wire[5:8], "big") == len(wire) - 8
    assert wire[8:18] == b"\x00\x00\x00\x01\x00\x00\x00\x00\x60\x00"  # id, associated id, priority << 5, slot
    assert decode_all(wire) == [SynStream(1, (("streamtype", "error"),), fin=True, priority=3)]


def test_decoder_waits_for_a_whole_frame_fed_byte_by_byte() -> None:
    compressor = HeaderCompressor()
    wire = encode_frame(SynReply(2, (("a", "b"),)), compressor) + encode_frame(Data(2, b"xyz"), compressor)
    decoder = FrameDecoder()
    frames = []
    for byte in wire:
        decoder.feed(bytes([byte]))
        while (frame := decoder.next_frame()) is not NEED_DATA:
            frames.append(frame)
    assert frames == [SynReply(2, (("a", "b"),)), Data(2, b"xyz")]


def test_other_spdy_versions_are_refused() -> None:
    with pytest.raises(RemoteProtocolError, match="version 2"):
        decode_all(b"\x80\x02\x00\x06\x00\x00\x00\x04\x00\x00\x00\x01")


def test_unknown_control_types_are_skipped() -> None:
    assert decode_all(b"\x80\x03\x00\x0a\x00\x00\x00\x02ab" + b"\x80\x03\x00\x06\x00\x00\x00\x04\x00\x00\x00\x01") == \
        [spdy.UnknownControl(10), Ping(1)]


def test_oversized_data_is_skipped_without_being_buffered() -> None:
    decoder = FrameDecoder(max_data_bytes=4)
    decoder.feed(b"\x00\x00\x00\x01\x00\x00\x00\x10" + b"x" * 6)
    assert decoder.next_frame() == spdy.OversizedData(1, 16)
    decoder.feed(b"x" * 10 + b"\x00\x00\x00\x01\x00\x00\x00\x01y")
    assert decoder.next_frame() == Data(1, b"y")
    assert decoder.buffered_bytes == 0


# -- the connection: streams ---------------------------------------------------------------------------

def test_client_opens_odd_streams_and_server_replies() -> None:
    client, server = pair()
    assert client.open_stream([("streamtype", "error")]) == 1
    assert client.open_stream([("streamtype", "data")]) == 3
    events = pump(client, server)
    assert events == [StreamOpened(1, (("streamtype", "error"),), False),
                      StreamOpened(3, (("streamtype", "data"),), False)]
    server.reply(1)
    server.reply(3)
    assert pump(server, client) == [StreamReplied(1, (), False), StreamReplied(3, (), False)]
    assert server.open_stream([]) == 2


def test_data_both_ways_and_a_stream_forgotten_once_closed_both_ways() -> None:
    client, server = pair()
    sid = client.open_stream([])
    pump(client, server)
    server.reply(sid)
    pump(server, client)
    client.send_data(sid, b"ping", fin=True)
    assert pump(client, server) == [DataReceived(sid, b"ping", True)]
    assert sid in server.open_streams
    server.send_data(sid, b"pong")
    server.end_stream(sid)
    assert pump(server, client) == [DataReceived(sid, b"pong", False), DataReceived(sid, b"", True)]
    assert not server.open_streams and not client.open_streams


def test_a_reused_or_wrong_parity_stream_id_ends_the_connection_with_goaway() -> None:
    server = Connection(client_side=False)
    peer = HeaderCompressor()  # the client's side of the header context
    server.receive_data(encode_frame(SynStream(1, ()), peer))
    with pytest.raises(RemoteProtocolError, match="not a new id"):
        server.receive_data(encode_frame(SynStream(1, ()), peer))
    assert decode_all(server.data_to_send()) == [GoAway(1, spdy.GoAwayStatus.PROTOCOL_ERROR)]
    with pytest.raises(RemoteProtocolError, match="not a new id"):
        Connection(client_side=False).receive_data(encode_frame(SynStream(2, ()), HeaderCompressor()))


def test_data_on_a_stream_never_opened_is_answered_with_invalid_stream() -> None:
    _, server = pair()
    assert server.receive_data(encode_frame(Data(9, b"x"), HeaderCompressor())) == []
    assert decode_all(server.data_to_send()) == [RstStream(9, RstStatus.INVALID_STREAM)]


def test_data_after_the_peers_fin_resets_that_stream_only() -> None:
    client, server = pair()
    a, b = client.open_stream([], fin=True), client.open_stream([])
    pump(client, server)
    events = server.receive_data(encode_frame(Data(a, b"late"), HeaderCompressor()))
    assert events == [StreamReset(a, RstStatus.STREAM_ALREADY_CLOSED, remote=False)]
    assert decode_all(server.data_to_send()) == [RstStream(a, RstStatus.STREAM_ALREADY_CLOSED)]
    assert server.open_streams == {b}


def test_reset_by_the_peer_forgets_the_stream() -> None:
    client, server = pair()
    sid = client.open_stream([])
    pump(client, server)
    client.reset_stream(sid)
    assert pump(client, server) == [StreamReset(sid, RstStatus.CANCEL)]
    assert not server.open_streams


def test_pings_are_echoed_and_our_own_acknowledged() -> None:
    client, server = pair()
    ping_id = client.ping()
    assert ping_id % 2 == 1
    assert pump(client, server) == [PingReceived(ping_id)]
    assert pump(server, client) == [PingAcknowledged(ping_id)]


def test_after_goaway_new_streams_are_refused() -> None:
    client, server = pair()
    server.goaway()
    assert pump(server, client) == [GoAwayReceived(0, 0)]
    with pytest.raises(spdy.LocalProtocolError):
        client.open_stream([])
    assert server.receive_data(encode_frame(SynStream(1, ()), HeaderCompressor())) == []
    assert decode_all(server.data_to_send()) == [RstStream(1, RstStatus.REFUSED_STREAM)]


# -- the connection: flow control ----------------------------------------------------------------------

def _open(client: Connection, server: Connection) -> int:
    sid = client.open_stream([])
    pump(client, server)
    server.reply(sid)
    pump(server, client)
    return sid


def test_sender_may_not_exceed_the_64k_window() -> None:
    client, server = pair()
    sid = _open(client, server)
    assert client.send_window(sid) == 65536
    client.send_data(sid, b"x" * 65536)
    assert client.send_window(sid) == 0
    with pytest.raises(spdy.LocalProtocolError, match="send window"):
        client.send_data(sid, b"x")


def test_acknowledged_data_returns_as_window_updates_for_stream_and_session() -> None:
    client, server = pair()
    sid = _open(client, server)
    client.send_data(sid, b"x" * 40000)
    pump(client, server)
    server.acknowledge(sid, 40000)
    assert pump(server, client) == [WindowUpdated(0, 40000), WindowUpdated(sid, 40000)]
    assert client.send_window(sid) == 65536


def test_data_beyond_the_stream_window_resets_the_stream() -> None:
    client, server = pair(initial_window_bytes=65536)
    sid = _open(client, server)
    server_stream_window = server.receive_window(sid)
    data = encode_frame(Data(sid, b"x" * (server_stream_window + 1)), HeaderCompressor())
    with pytest.raises(RemoteProtocolError, match="session window"):
        server.receive_data(data)  # beyond the session window too, which is a connection error


def test_a_smaller_initial_window_setting_shrinks_the_peers_send_window() -> None:
    client = Connection(client_side=True)
    server = Connection(client_side=False, initial_window_bytes=1000)
    pump(server, client)  # SETTINGS
    sid = _open(client, server)
    assert client.send_window(sid) == 1000
    events = server.receive_data(encode_frame(Data(sid, b"x" * 1001), HeaderCompressor()))
    assert events == [StreamReset(sid, RstStatus.FLOW_CONTROL_ERROR, remote=False)]


def test_without_flow_control_nothing_is_enforced_or_updated() -> None:
    # Kubernetes' spdystream neither sends WINDOW_UPDATE nor keeps to windows.
    client, server = pair(flow_control=False)
    sid = _open(client, server)
    client.send_data(sid, b"x" * 300_000)
    events = pump(client, server)
    assert sum(len(e.data) for e in events) == 300_000
    server.acknowledge(sid, 300_000)
    assert server.data_to_send() == b""


def test_large_sends_are_split_into_frames_of_the_limit() -> None:
    client, server = pair(flow_control=False)
    sid = _open(client, server)
    client.send_data(sid, b"y" * (spdy.MAX_DATA_BYTES + 5), fin=True)
    frames = decode_all(client.data_to_send())
    assert [len(f.data) for f in frames] == [spdy.MAX_DATA_BYTES, 5]
    assert [f.fin for f in frames] == [False, True]
