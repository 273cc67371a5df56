"""shim.rpc.frames: the sans-IO frame codec, on byte strings only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shim.rpc.frames import (
    CLOSED,
    HEADER,
    HEADER_BYTES,
    MAX_DATA_BYTES,
    MAX_LENGTH_FIELD,
    NEED_DATA,
    Flags,
    Frame,
    FrameDecoder,
    LocalProtocolError,
    MessageType,
    OversizedFrame,
    RemoteProtocolError,
    encode_frame,
)

MiB = 1 << 20


def drain(decoder: FrameDecoder) -> list:
    """Every event the decoder can produce now, NEED_DATA not included."""
    events = []
    while (ev := decoder.next_event()) is not NEED_DATA:
        events.append(ev)
        if ev is CLOSED:
            break
    return events


def decode(*chunks: bytes) -> list:
    """Feed the non-empty ``chunks`` one at a time, then EOF; return every event in order."""
    decoder = FrameDecoder()
    events = []
    for chunk in chunks:
        if chunk:  # feed(b"") means EOF
            decoder.feed(chunk)
            events += drain(decoder)
    decoder.feed(b"")
    return events + drain(decoder)


def as_bytes(frames: list[Frame]) -> bytes:
    return b"".join(encode_frame(f.stream_id, f.type, f.flags, f.data) for f in frames)


frames_strategy = st.lists(
    st.builds(
        Frame,
        stream_id=st.integers(0, 2**32 - 1),
        type=st.integers(0, 255),
        flags=st.integers(0, 255),
        data=st.binary(max_size=64),
    ),
    max_size=6,
)


def test_header_is_length_stream_type_flags_big_endian() -> None:
    frame = encode_frame(0x01020304, MessageType.RESPONSE, Flags.NO_DATA, b"xy")
    assert frame == bytes.fromhex("00000002" "01020304" "02" "04") + b"xy"


def test_frame_round_trips() -> None:
    data = encode_frame(7, MessageType.REQUEST, Flags.REMOTE_OPEN, b"payload")
    assert decode(data) == [Frame(7, 1, 0x2, b"payload"), CLOSED]


def test_empty_data_round_trips() -> None:
    assert decode(encode_frame(1, MessageType.DATA, Flags.NO_DATA, b"")) == [Frame(1, 3, 0x4, b""), CLOSED]


def test_frame_of_exactly_the_limit_decodes() -> None:
    data = bytes(MAX_DATA_BYTES)
    assert decode(encode_frame(1, MessageType.REQUEST, 0, data)) == [Frame(1, 1, 0, data), CLOSED]


@given(frames_strategy)
def test_frames_split_at_every_byte_boundary_decode_the_same(frames) -> None:
    wire = as_bytes(frames)
    for cut in range(len(wire) + 1):
        assert decode(wire[:cut], wire[cut:]) == [*frames, CLOSED]


@given(frames_strategy, st.data())
def test_frames_in_random_chunks_decode_the_same(frames, data) -> None:
    wire = as_bytes(frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=20)))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=False)]
    assert decode(*chunks) == [*frames, CLOSED]


def test_incomplete_frame_needs_data() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(1, MessageType.REQUEST, 0, b"abc")[:-1])
    assert decoder.next_event() is NEED_DATA


def test_clean_eof_gives_closed_every_time() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"")
    assert (decoder.next_event(), decoder.next_event()) == (CLOSED, CLOSED)


@pytest.mark.parametrize("cut", [1, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 2], ids=lambda n: f"after-{n}-bytes")
def test_eof_inside_a_frame_raises(cut) -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(1, MessageType.REQUEST, 0, b"abcd")[:cut])
    decoder.feed(b"")
    with pytest.raises(RemoteProtocolError, match="middle of a frame"):
        decoder.next_event()


def test_feed_after_eof_is_a_local_error() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"")
    with pytest.raises(LocalProtocolError):
        decoder.feed(b"x")


def test_oversized_frame_is_skipped_without_buffering_and_the_next_frame_decodes() -> None:
    length = 5 * MiB
    chunk = 64 << 10
    decoder = FrameDecoder()
    decoder.feed(HEADER.pack(length, 3, MessageType.REQUEST, 0) + bytes(chunk))
    assert decoder.next_event() == OversizedFrame(3, MessageType.REQUEST, 0, length)
    left = length - chunk
    while left > chunk:
        decoder.feed(bytes(chunk))
        assert decoder.next_event() is NEED_DATA
        assert decoder.buffered_bytes == 0
        left -= chunk
    # The last chunk ends the skipped body and carries the next frame.
    decoder.feed(bytes(left) + encode_frame(5, MessageType.REQUEST, 0, b"next"))
    assert drain(decoder) == [Frame(5, 1, 0, b"next")]


def test_oversized_frame_announced_by_header_alone() -> None:
    decoder = FrameDecoder()
    decoder.feed(HEADER.pack(MAX_DATA_BYTES + 1, 1, MessageType.DATA, 0))
    assert decoder.next_event() == OversizedFrame(1, MessageType.DATA, 0, MAX_DATA_BYTES + 1)


def test_eof_inside_a_skipped_frame_raises() -> None:
    decoder = FrameDecoder()
    decoder.feed(HEADER.pack(MAX_DATA_BYTES + 1, 1, MessageType.REQUEST, 0) + b"part")
    assert type(decoder.next_event()) is OversizedFrame
    decoder.feed(b"")
    with pytest.raises(RemoteProtocolError):
        decoder.next_event()


def test_largest_length_below_the_reserved_byte_is_only_oversized() -> None:
    decoder = FrameDecoder()
    decoder.feed(HEADER.pack(MAX_LENGTH_FIELD - 1, 1, MessageType.REQUEST, 0))
    assert type(decoder.next_event()) is OversizedFrame


@pytest.mark.parametrize("length", [MAX_LENGTH_FIELD, 2**32 - 1], ids=["16MiB", "4GiB"])
def test_length_with_the_reserved_byte_set_raises(length) -> None:
    decoder = FrameDecoder()
    decoder.feed(HEADER.pack(length, 1, MessageType.REQUEST, 0))
    with pytest.raises(RemoteProtocolError, match="reserved byte"):
        decoder.next_event()


def test_encode_refuses_data_over_the_limit() -> None:
    with pytest.raises(LocalProtocolError, match="limit"):
        encode_frame(1, MessageType.REQUEST, 0, bytes(MAX_DATA_BYTES + 1))


@pytest.mark.parametrize("stream_id", [-1, 2**32], ids=["negative", "over-u32"])
def test_encode_refuses_a_stream_id_out_of_range(stream_id) -> None:
    with pytest.raises(LocalProtocolError):
        encode_frame(stream_id, MessageType.REQUEST, 0, b"")
