"""critest 1.26's Streaming specs (exec, attach, port-forward through the runtime's streaming server)
against podshimd, with critest's images from the local registry (tests/imagebuild.py).

Port-forward's spec first fetches the web server's page at the pod's IP, so the pod needs a network:
podshimd and critest both run inside a network namespace this test makes, with a CNI bridge there
(never on the machine's network); the local registry, on the machine's loopback, is reached through a
relay that listens on the same address inside that namespace."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from critools import run_critest, running_podshimd
from imagebuild import critest_images
from shim.kernel.netns import socket_in_netns


@contextmanager
def relay(netns: str, host: str, port: int) -> Iterator[None]:
    """Listen on host:port inside ``netns``; every connection is joined to host:port outside it."""
    listener = socket_in_netns(netns)
    listener.bind((host, port))
    listener.listen(64)
    joined: list[socket.socket] = []

    def pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def accept() -> None:
        while True:
            try:
                inside, _ = listener.accept()
            except OSError:
                return  # the listener was closed: the relay ends
            outside = socket.create_connection((host, port))
            joined.extend((inside, outside))
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        acceptor.join()
        for sock in joined:
            sock.close()


def test_critest_streaming_specs_pass(critest, test_images, outer_netns, tmp_path):
    images = critest_images(test_images)
    registry_host, registry_port = images.registry.host.rsplit(":", 1)
    wrapper = tmp_path / "critest-in-netns"  # critest run where the pods' network is
    wrapper.write_text(f'#!/bin/sh\nexec nsenter --net={outer_netns} -- {critest} "$@"\n')
    wrapper.chmod(0o755)
    directory = tempfile.mkdtemp(prefix="psd-cst-")
    try:
        os.makedirs(os.path.join(directory, "net.d"))
        with open(os.path.join(directory, "net.d", "10-critest.conflist"), "w") as f:
            json.dump({"cniVersion": "1.0.0", "name": "critest", "plugins": [
                {"type": "bridge", "bridge": "cst0", "isGateway": True, "ipMasq": False,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.215.0.0/24"}]],
                          "dataDir": os.path.join(directory, "ipam")}}]}, f)
        with relay(outer_netns, registry_host, int(registry_port)), \
                running_podshimd(directory, config=images.podshim_registry_config(), netns=outer_netns) as daemon:
            result = run_critest(str(wrapper), daemon.endpoint, images, focus="Streaming", cwd=str(tmp_path))
            assert "Traceback" not in daemon.log()
    finally:
        shutil.rmtree(directory)
    assert (result.passed, result.failed) == (5, 0), f"{result.failures}\n{result.output[-6000:]}"
