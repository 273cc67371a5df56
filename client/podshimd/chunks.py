"""The answers of the Stream* RPCs (StreamPodSandboxes, StreamContainers, StreamImages,
StreamContainerStats, StreamPodSandboxStats, StreamPodSandboxMetrics): their List counterpart's
items, in its order, sent in chunks.

kubelet (k8s.io/cri-client, feature gate CRIListStreaming) calls a Stream* RPC, appends the items of
every message it receives until the end of the stream, and falls back to the List RPC when the
Stream one answers UNIMPLEMENTED; it receives messages of up to 16 MiB, other clients gRPC's default
4 MiB. A chunk holds at least one item and at most :data:`CHUNK_BYTES` of encoded items (an item
larger than that goes alone), so a message stays well under either limit however many items there
are; no items, no message: the stream just ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from google.protobuf.message import Message

__all__ = ["CHUNK_BYTES", "chunks", "encoded_size"]

#: The most bytes of encoded items one message carries (unless one item alone is larger).
CHUNK_BYTES = 1 << 20


def encoded_size(item: Message) -> int:
    """The bytes ``item`` takes as an element of a repeated message field: its tag (one byte: every
    Stream* response's field number is below 16), its length's varint, and itself."""
    size: int = item.ByteSize()
    return 1 + max(1, (size.bit_length() + 6) // 7) + size


def chunks(items: Iterable[Message], limit: int = CHUNK_BYTES) -> Iterator[list[Message]]:
    """``items`` in order, in lists of at least one whose encoded sizes add up to at most ``limit``
    bytes (an item larger than ``limit`` is a list of its own); each item in exactly one list."""
    chunk: list[Message] = []
    size = 0
    for item in items:
        n = encoded_size(item)
        if chunk and size + n > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += n
    if chunk:
        yield chunk
