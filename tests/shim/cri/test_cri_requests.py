"""The shared CRI layer's reading of RunPodSandbox's and CreateContainer's configs from their
protobuf requests (shim.cri.requests), which podshimd and the containerd shim both use."""

from __future__ import annotations

import pytest

from shim.cri import requests
from shim.cri.api import api_pb2
from shim.rpc.status import InvalidArgument


def test_an_env_value_is_its_text_not_protobuf_json_s_base64() -> None:
    # KeyValue.value is bytes since CRI 1.37; protobuf's JSON would give "aGVsbG8=".
    config = api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="c"), command=["true"],
                                     image=api_pb2.ImageSpec(image="busybox"),
                                     envs=[api_pb2.KeyValue(key="A", value=b"hello"), api_pb2.KeyValue(key="B")])
    assert requests.container_config(api_pb2.CreateContainerRequest(config=config)).envs == (("A", "hello"),
                                                                                             ("B", ""))


@pytest.mark.parametrize("value,named", [(b"\xff\xfe", r"envs\[0\].value is not UTF-8 text"),
                                         (b"a\0b", r"envs\[0\].value holds a NUL byte")])
def test_an_env_value_that_is_not_text_is_refused_by_name(value, named) -> None:
    config = api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="c"), command=["true"],
                                     envs=[api_pb2.KeyValue(key="A", value=value)])
    with pytest.raises(InvalidArgument, match=named):
        requests.container_config(api_pb2.CreateContainerRequest(config=config))


@pytest.mark.parametrize("read,empty", [(requests.pod_sandbox_config, api_pb2.RunPodSandboxRequest()),
                                          (requests.container_config, api_pb2.CreateContainerRequest())],
                         ids=["pod", "container"])
def test_a_request_without_a_config_is_refused_by_name(read, empty) -> None:
    with pytest.raises(InvalidArgument, match="config is required$"):
        read(empty)


def test_a_container_without_an_image_is_refused() -> None:
    config = api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="c"), command=["true"])
    with pytest.raises(InvalidArgument, match="config.image.image is empty"):
        requests.container_config(api_pb2.CreateContainerRequest(config=config))


def test_a_pod_config_is_read_with_its_proto3_zero_values() -> None:
    # network is unset (0): POD, as CRI's proto3 zero value says; pid is given.
    config = api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name="p", namespace="default", uid="u"),
        linux=api_pb2.LinuxPodSandboxConfig(security_context=api_pb2.LinuxSandboxSecurityContext(
            namespace_options=api_pb2.NamespaceOption(pid=api_pb2.CONTAINER))))
    read = requests.pod_sandbox_config(api_pb2.RunPodSandboxRequest(config=config))
    assert (read.metadata.name, read.metadata.namespace, read.metadata.uid) == ("p", "default", "u")
    assert (read.namespace_options.network, read.namespace_options.pid) == ("POD", "CONTAINER")
