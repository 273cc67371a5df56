"""podshim-sandboxer's gRPC Controller (shim.containerd.proxy) without containerd: what it refuses,
with which status and sentence, and what it answers for pods that are gone. The proxy route with the
real containerd is test_containerd_proxy.py."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest

from shim.api.names import UNKNOWN_EXIT_STATUS
from shim.containerd.proxy import CONTROLLER_SERVICE, serve
from shim.containerd.sandboxer import NAMESPACE_HEADER, SandboxerConfig, controller_pb2

pb2 = controller_pb2


@pytest.fixture
async def controller(tmp_path):
    """A sandboxer serving on a socket of the test's own (no template); a function that makes one call."""
    listen = str(tmp_path / "sb.sock")
    config = SandboxerConfig(state_root=str(tmp_path / "state"), runtime_root=str(tmp_path / "run"),
                             containerd_address=str(tmp_path / "c.sock.ttrpc"), use_template=False)
    stop = asyncio.Event()
    server = asyncio.create_task(serve(config, listen, stop=stop))
    while not os.path.exists(listen):
        assert not server.done(), server.exception()
        await asyncio.sleep(0.01)
    channel = grpc.aio.insecure_channel("unix://" + listen)

    async def call(method, request, reply, namespace="k8s.io"):
        metadata = () if namespace is None else ((NAMESPACE_HEADER, namespace),)
        rpc = channel.unary_unary(f"/{CONTROLLER_SERVICE}/{method}", request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=reply.FromString)
        return await rpc(request, metadata=metadata, timeout=30)

    call.state_root = config.state_root
    try:
        yield call
    finally:
        await channel.close()
        stop.set()
        await server
    assert not os.path.exists(listen)


async def _status_of(call):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details()


async def test_a_call_without_containerds_namespace_is_invalid(controller) -> None:
    code, details = await _status_of(controller("Status", pb2.ControllerStatusRequest(sandbox_id="p1"),
                                                pb2.ControllerStatusResponse, namespace=None))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert NAMESPACE_HEADER in details


async def test_an_unknown_sandbox_is_not_found(controller) -> None:
    code, details = await _status_of(controller("Status", pb2.ControllerStatusRequest(sandbox_id="p1"),
                                                pb2.ControllerStatusResponse))
    assert code == grpc.StatusCode.NOT_FOUND
    assert "'p1'" in details


async def test_a_sandbox_id_that_is_not_an_identifier_is_invalid(controller) -> None:
    code, _ = await _status_of(controller("Platform", pb2.ControllerPlatformRequest(sandbox_id="../etc"),
                                          pb2.ControllerPlatformResponse))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_create_with_a_rootfs_is_refused_and_leaves_nothing(controller) -> None:
    from shim.containerd.api import load

    mount_pb2 = load("types.mount_pb2")
    request = pb2.ControllerCreateRequest(sandbox_id="p1", rootfs=[mount_pb2.Mount(type="overlay", source="x")])
    code, details = await _status_of(controller("Create", request, pb2.ControllerCreateResponse))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "rootfs" in details
    assert not os.path.exists(os.path.join(controller.state_root, "k8s.io", "p1"))


async def test_update_is_unimplemented_with_a_sentence(controller) -> None:
    os.makedirs(os.path.join(controller.state_root, "k8s.io", "p1"))
    code, details = await _status_of(controller("Update", pb2.ControllerUpdateRequest(sandbox_id="p1",
                                                                                      fields=["extensions"]),
                                                pb2.ControllerUpdateResponse))
    assert code == grpc.StatusCode.UNIMPLEMENTED  # containerd's CRI tolerates it
    assert "extensions" in details


async def test_wait_for_a_pod_whose_shim_is_gone_answers_with_an_exit_not_unavailable(controller) -> None:
    # (containerd retries an UNAVAILABLE Wait forever: a dead pod must answer)
    os.makedirs(os.path.join(controller.state_root, "k8s.io", "p1"))
    done = await controller("Wait", pb2.ControllerWaitRequest(sandbox_id="p1"), pb2.ControllerWaitResponse)
    assert done.exit_status == UNKNOWN_EXIT_STATUS
    status = await controller("Status", pb2.ControllerStatusRequest(sandbox_id="p1"), pb2.ControllerStatusResponse)
    assert (status.state, status.version) == ("SANDBOX_NOTREADY", 3)
    assert status.address.startswith("ttrpc+unix:///")


async def test_shutdown_removes_the_bundle_and_is_no_error_twice(controller) -> None:
    bundle = os.path.join(controller.state_root, "k8s.io", "p1")
    os.makedirs(bundle)
    for _ in range(2):
        await controller("Shutdown", pb2.ControllerShutdownRequest(sandbox_id="p1"), pb2.ControllerShutdownResponse)
        assert not os.path.exists(bundle)
