"""This host's OCI platform, as image indexes name platforms (what a pull selects, what Platform answers)."""

from __future__ import annotations

import os

__all__ = ["host_platform"]


def host_platform() -> dict[str, str]:
    """This host's OCI platform: os, architecture (GOARCH names) and variant."""
    machine = os.uname().machine.lower()
    arch, variant = {
        "x86_64": ("amd64", ""), "amd64": ("amd64", ""), "aarch64": ("arm64", "v8"), "arm64": ("arm64", "v8"),
        "armv7l": ("arm", "v7"), "armv6l": ("arm", "v6"), "i686": ("386", ""), "i386": ("386", ""),
        "ppc64le": ("ppc64le", ""), "s390x": ("s390x", ""), "riscv64": ("riscv64", ""),
    }.get(machine, (machine, ""))
    return {"os": "linux", "architecture": arch, "variant": variant}
