"""CDI device names (``vendor.com/class=name``): the grammar a config's ``CDI_devices`` are
checked against when the config is read. Resolving a name with the node's CDI spec files is the
pod layer's (:mod:`client.cri.cdi`), which checks a spec's ``kind`` and device names with the
same patterns.
"""

from __future__ import annotations

import re

from shim.rpc.status import InvalidArgument

__all__ = ["KIND", "DEVICE", "parse_name"]

# vendor: a domain-like name; class: alphanumerics with - and _ (and . since 0.6.0); name: alphanumerics with - _ . :
#: A CDI kind, ``vendor.com/class``.
KIND = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
#: A CDI device's name within its kind.
DEVICE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def parse_name(name: str) -> tuple[str, str]:
    """A fully qualified CDI device name as (kind, device); InvalidArgument when it is not one."""
    kind, sep, device = name.partition("=")
    if not sep or KIND.match(kind) is None or DEVICE.match(device) is None:
        raise InvalidArgument(f"CDI device {name!r} is not a fully qualified CDI device name "
                              "(vendor.com/class=name)")
    return kind, device
