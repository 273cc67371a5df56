"""What podshim's shim applies of containerd's OCI spec, as the runtime-spec's features document
(runtime-spec features.md): ``containerd-shim-podshim-v1 -info`` answers it in a RuntimeInfo.

The mount options are a bind's and a tmpfs's flags (a tmpfs's parameters, ``size=`` and the
like, are not listed, as runc lists none). containerd's CRI reads the handler's features from it: ``mountOptions`` holding ``rro`` means
recursive read-only mounts are supported, ``linux.namespaces`` holding ``user`` with
``mountExtensions.idmap`` enabled means user namespaces are. Each list here is what
:func:`shim.containerd.tasks.task_fields` takes from a config.json, so the document cannot claim
what the shim refuses.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BIND_OPTIONS", "FEATURES_TYPE_URL", "NAMESPACES", "OCI_VERSION_MAX", "OCI_VERSION_MIN",
           "runtime_features"]

#: The mount options of a config.json bind mount the shim applies (protocol.md 7.3, ``mounts``).
BIND_OPTIONS = frozenset({"bind", "rbind", "ro", "rro", "rw", "nosuid", "nodev", "noexec", "rprivate", "rslave",
                          "rshared", "private", "slave", "shared"})
#: The namespaces a task has: its own mount namespace, the pod's network, IPC and UTS namespaces,
#: and a pid namespace of its own or the pod's (no user namespace through containerd yet).
NAMESPACES = ("ipc", "mount", "network", "pid", "uts")
#: The runtime-spec versions of the configs the shim reads (containerd 2.3 writes 1.3's).
OCI_VERSION_MIN, OCI_VERSION_MAX = "1.0.0", "1.3.0"
#: containerd's type URL of the runtime-spec's features.Features (a JSON value in an Any).
FEATURES_TYPE_URL = "types.containerd.io/opencontainers/runtime-spec/1/features/Features"


def runtime_features() -> dict[str, Any]:
    """The runtime-spec features document of the shim (a JSON object)."""
    from shim.kernel.seccomp import ACTIONS, ARCHITECTURES, FLAGS, OPERATORS
    from shim.lib.capabilities import CAPABILITIES
    from shim.runtime.hooks import HOOK_NAMES
    from shim.runtime.mounts import TMPFS_FLAGS

    return {
        "ociVersionMin": OCI_VERSION_MIN,
        "ociVersionMax": OCI_VERSION_MAX,
        "hooks": list(HOOK_NAMES),
        "mountOptions": sorted(BIND_OPTIONS | TMPFS_FLAGS),
        "linux": {
            "namespaces": list(NAMESPACES),
            "capabilities": list(CAPABILITIES),
            "cgroup": {"v1": True, "v2": True, "systemd": False, "systemdUser": False, "rdma": False},
            "seccomp": {"enabled": True, "actions": list(ACTIONS), "operators": list(OPERATORS),
                        "archs": list(ARCHITECTURES), "knownFlags": list(FLAGS), "supportedFlags": list(FLAGS)},
            "apparmor": {"enabled": False},
            "selinux": {"enabled": False},
            "intelRdt": {"enabled": False},
            "mountExtensions": {"idmap": {"enabled": False}},
        },
    }
