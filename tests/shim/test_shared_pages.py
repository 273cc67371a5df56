"""What keeps a forked shim's pages shared with its template: work a shim need not redo is not redone."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

import pytest

from shim import daemon
from shim.kernel import devices
from shim.lib.logs import setup_logging

_PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def root_logging():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield root
    root.handlers[:], level = saved
    root.setLevel(level)


def test_logging_set_up_again_the_same_way_is_left_as_it_is(root_logging):
    setup_logging()
    [handler] = root_logging.handlers
    logger = logging.getLogger("shim.test.cache")
    assert logger.isEnabledFor(logging.INFO)
    cached = dict(logger._cache)
    setup_logging()  # a shim forked from a template that set it up so: nothing to write
    assert root_logging.handlers == [handler] and logger._cache == cached == {logging.INFO: True}
    setup_logging(debug=True)  # asked otherwise: applied
    assert root_logging.level == logging.DEBUG and logger._cache == {}
    assert root_logging.handlers[0].stream is handler.stream


def test_a_device_program_is_made_once_per_rule_set() -> None:
    assert devices.program(devices.DEFAULT_RULES) is devices.program(devices.DEFAULT_RULES)
    rules = devices.DEFAULT_RULES.plus([devices.DeviceRule(kind="b", major=240, minor=0, access="r")])
    assert devices.program(rules) != devices.program(devices.DEFAULT_RULES)


def _resident(address: int, length: int) -> list[bool]:
    first, end = -(-address // _PAGE), (address + length) // _PAGE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        data = f.read((end - first) * 8)
    return [bool(int.from_bytes(data[i:i + 8], "little") >> 63) for i in range(0, len(data), 8)]


def test_a_uvloop_loop_gives_back_its_read_buffer_until_a_read_needs_it() -> None:
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        size = type(loop).__basicsize__
        assert sum(_resident(id(loop), size)) > 50  # made zeroed: every page of it written
        daemon._release_read_buffer(loop)
        assert sum(_resident(id(loop), size)) <= 2  # the pages its fields share with the buffer's ends
        payload = os.urandom(200_000)

        async def transfer() -> bytes:
            ours, theirs = socket.socketpair()
            reader, writer = await asyncio.open_connection(sock=ours)
            theirs.sendall(payload)
            theirs.close()
            try:
                return await reader.read()
            finally:
                writer.close()

        assert loop.run_until_complete(transfer()) == payload  # through the buffer, written anew
    finally:
        loop.close()
