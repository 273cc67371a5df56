"""RuntimeService's Version and Status: what the runtime is and whether it is ready."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import shim
from client.cri.cni import CniConfig
from client.criapi import api_pb2
from shim.rpc.status import RpcError

from .config import Config
from .handlers import Handlers

__all__ = ["RUNTIME_NAME", "RUNTIME_API_VERSION", "KUBELET_API_VERSION", "RuntimeInfo"]

RUNTIME_NAME = "podshim"
RUNTIME_API_VERSION = "v1"
#: VersionResponse.version: "the version of the kubelet runtime API", which every runtime answers so.
KUBELET_API_VERSION = "0.1.0"


class RuntimeInfo(Handlers):
    """Version and Status."""

    async def Version(self, request: api_pb2.VersionRequest, context: Any) -> api_pb2.VersionResponse:
        return api_pb2.VersionResponse(version=KUBELET_API_VERSION, runtime_name=RUNTIME_NAME,
                                       runtime_version=shim.__version__, runtime_api_version=RUNTIME_API_VERSION)

    async def Status(self, request: api_pb2.StatusRequest, context: Any) -> api_pb2.StatusResponse:
        conditions = [api_pb2.RuntimeCondition(type="RuntimeReady", status=True), self._network_condition()]
        info = {}
        if request.verbose:
            info["config"] = _config_json(self.config)
            info["podCIDR"] = json.dumps(self.pods.pod_cidr)  # as UpdateRuntimeConfig set it
        return api_pb2.StatusResponse(status=api_pb2.RuntimeStatus(conditions=conditions), info=info)

    def _network_condition(self) -> api_pb2.RuntimeCondition:
        # As containerd: the network is ready once a CNI network configuration exists.
        def not_ready(message: str) -> api_pb2.RuntimeCondition:
            return api_pb2.RuntimeCondition(type="NetworkReady", status=False, reason="NetworkPluginNotReady",
                                            message=message)
        try:
            network = CniConfig.load(self.config.cni_conf_dir)
        except RpcError as exc:
            return not_ready(f"the CNI network config is not valid: {exc.message}")
        if network is None:
            return not_ready(f"no CNI network config found in {self.config.cni_conf_dir}")
        return api_pb2.RuntimeCondition(type="NetworkReady", status=True)


def _config_json(config: Config) -> str:
    return json.dumps(dataclasses.asdict(config), sort_keys=True)
