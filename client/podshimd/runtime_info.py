"""RuntimeService's Version, Status and RuntimeConfig: what the runtime is, what it can do, and
whether it is ready.

Status lists each runtime handler a client may ask for (config ``runtime_handlers``) with its
features, and the runtime's features; each feature is true only where podshim applies it: read from
the CRI field table (:mod:`shim.cri.fields`), whose refused fields are the features podshim lacks.
RuntimeConfig answers the cgroup driver in force (config ``cgroup_driver``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import shim
from shim.cri import fields
from shim.cri.api import api_pb2
from shim.rpc.status import RpcError

from client.cri.cni import CniConfig

from .config import Config
from .handlers import Handlers

__all__ = ["RUNTIME_NAME", "RUNTIME_API_VERSION", "KUBELET_API_VERSION", "CGROUP_DRIVERS", "RuntimeInfo",
           "handler_features", "runtime_features"]

RUNTIME_NAME = "podshim"
RUNTIME_API_VERSION = "v1"
#: VersionResponse.version: "the version of the kubelet runtime API", which every runtime answers so.
KUBELET_API_VERSION = "0.1.0"
#: config ``cgroup_driver`` -> CRI's CgroupDriver.
CGROUP_DRIVERS = {"cgroupfs": api_pb2.CgroupDriver.CGROUPFS, "systemd": api_pb2.CgroupDriver.SYSTEMD}


def _applied(table: dict[str, fields.Field], path: str, handler: str = "") -> bool:
    """Whether ``handler`` (any handler: "") applies the field at ``path``."""
    field = table[path]
    return field.applied_by(handler) if handler else field.kind == fields.APPLIED and not field.handlers


def handler_features(handler: str) -> api_pb2.RuntimeHandlerFeatures:
    """What runtime handler ``handler`` (native, runc, crun) supports."""
    return api_pb2.RuntimeHandlerFeatures(
        recursive_read_only_mounts=_applied(fields.CONTAINER_CONFIG, "mounts.recursive_read_only", handler),
        user_namespaces=_applied(fields.POD_SANDBOX_CONFIG, "linux.security_context.namespace_options.userns_options",
                                 handler))


def runtime_features() -> api_pb2.RuntimeFeatures:
    """The runtime's features. ``user_namespaces_host_network`` is false: no user namespace of a
    pod's own is supported at all (with the host's network or not)."""
    return api_pb2.RuntimeFeatures(
        supplemental_groups_policy=_applied(fields.CONTAINER_CONFIG,
                                            "linux.security_context.supplemental_groups_policy"),
        user_namespaces_host_network=False,
        mount_options=_applied(fields.CONTAINER_CONFIG, "mounts.mount_options"))


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
        handlers = [api_pb2.RuntimeHandler(name=name, features=handler_features(name))
                    for name in self.config.runtime_handlers]
        # CRI: the default handler is also listed with an empty name (kubelet's "" means it).
        handlers.insert(0, api_pb2.RuntimeHandler(name="", features=handler_features(self.config.default_runtime_handler)))
        return api_pb2.StatusResponse(status=api_pb2.RuntimeStatus(conditions=conditions), info=info,
                                      runtime_handlers=handlers, features=runtime_features())

    async def RuntimeConfig(self, request: api_pb2.RuntimeConfigRequest, context: Any) -> api_pb2.RuntimeConfigResponse:
        return api_pb2.RuntimeConfigResponse(linux=api_pb2.LinuxRuntimeConfiguration(
            cgroup_driver=CGROUP_DRIVERS[self.config.cgroup_driver]))

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
