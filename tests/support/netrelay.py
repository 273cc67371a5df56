"""A TCP relay from inside a network namespace to this one's loopback, for tests.

``loopback_relay(netns_path, port)`` listens on ``127.0.0.1:port`` inside the namespace pinned at
``netns_path`` and forwards every connection to ``127.0.0.1:port`` here: a podshimd (and critest)
that run inside a throwaway namespace, so that their CNI bridge never touches the machine's
network, still reach the tests' local registry at the address its images are named by.

The listening socket is made by a thread that joins the namespace for that one call (a network
namespace is a per-thread attribute; a socket keeps the namespace it was made in); every relayed
connection gets two copying threads. Leaving the block closes the listener and every connection
and joins every thread.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from shim.kernel.linux import CLONE_NEWNET, setns

__all__ = ["loopback_relay"]

_CHUNK = 65536


def _listen_in(netns_path: str, port: int) -> socket.socket:
    made: list[socket.socket | BaseException] = []

    def inside() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        target = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            setns(target, CLONE_NEWNET)
            try:
                made.append(socket.create_server(("127.0.0.1", port)))
            finally:
                setns(own, CLONE_NEWNET)  # this thread ends anyway; back home all the same
        except BaseException as exc:  # handed to the caller's thread
            made.append(exc)
        finally:
            os.close(own)
            os.close(target)

    thread = threading.Thread(target=inside, name="netns-listen")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
    except OSError:
        pass  # the other side went away, or the relay is closing
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


@contextmanager
def loopback_relay(netns_path: str, port: int) -> Iterator[None]:
    """Relay ``127.0.0.1:port`` inside ``netns_path`` to ``127.0.0.1:port`` here until the block ends."""
    listener = _listen_in(netns_path, port)
    sockets: list[socket.socket] = []
    threads: list[threading.Thread] = []
    closing = threading.Event()

    def accept() -> None:
        while not closing.is_set():
            try:
                inner, _ = listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                outer = socket.create_connection(("127.0.0.1", port))
            except OSError:
                inner.close()
                continue
            sockets.extend((inner, outer))
            for a, b in ((inner, outer), (outer, inner)):
                t = threading.Thread(target=_pipe, args=(a, b), name="netns-relay", daemon=True)
                threads.append(t)
                t.start()

    acceptor = threading.Thread(target=accept, name="netns-accept")
    acceptor.start()
    try:
        yield
    finally:
        closing.set()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        acceptor.join()
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in threads:
            t.join()
