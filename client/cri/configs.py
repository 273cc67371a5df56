"""Moved: CRI's configs as frozen dataclasses are :mod:`shim.cri.configs` (the CRI layer the shim
and its clients share). This name stays for code outside the repository that builds a
:class:`PodSandboxConfig` or :class:`ContainerConfig` for the pod layer; code in the repository
imports :mod:`shim.cri.configs`.
"""

from __future__ import annotations

from shim.cri.configs import (
    MAX_ATTEMPT,
    NAMESPACE_MODES,
    PROPAGATIONS,
    PROTOCOLS,
    SANDBOX_OOM_SCORE_ADJ,
    ContainerConfig,
    ContainerMetadata,
    Device,
    DnsConfig,
    Mount,
    NamespaceOptions,
    PodSandboxConfig,
    PodSandboxMetadata,
    PortMapping,
    load_json_object,
    set_fields,
)

__all__ = ["NAMESPACE_MODES", "set_fields", "PROTOCOLS", "SANDBOX_OOM_SCORE_ADJ", "MAX_ATTEMPT", "PodSandboxMetadata",
           "DnsConfig", "PortMapping", "NamespaceOptions", "PodSandboxConfig", "ContainerMetadata",
           "ContainerConfig", "Mount", "Device", "PROPAGATIONS", "load_json_object"]
