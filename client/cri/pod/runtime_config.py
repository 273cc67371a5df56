"""UpdateRuntimeConfig: the node's pod CIDR, recorded (containerd's update_runtime_config.go)."""

from __future__ import annotations

import ipaddress

from shim.lib.files import read_json, write_json_atomic
from shim.rpc.status import InvalidArgument

from client.cri.pod.base import PodServiceBase, log


class RuntimeConfig(PodServiceBase):
    """The pod service's runtime config part (:class:`client.cri.pod.PodService` is all of them)."""

    @property
    def pod_cidr(self) -> str:
        """The node's pod CIDR(s) as UpdateRuntimeConfig last set them ("" if never)."""
        try:
            doc = read_json(self._runtime_config_path)
        except (OSError, ValueError):
            return ""
        return doc.get("pod_cidr", "") if isinstance(doc, dict) and isinstance(doc.get("pod_cidr"), str) else ""

    def update_runtime_config(self, pod_cidr: str) -> None:
        """UpdateRuntimeConfig: record the node's pod CIDR (one, or an IPv4 and an IPv6 one
        separated by a comma) and say what it changes. The CNI plugins' own config (conf dir)
        decides the pods' addresses: podshim writes no CNI config from it, as containerd without a
        ``conf_template``. An empty CIDR changes nothing. Raises InvalidArgument for a bad CIDR."""
        if not pod_cidr:
            return
        networks = []
        for part in pod_cidr.split(","):
            try:
                networks.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError:
                raise InvalidArgument(f"pod CIDR {part.strip()!r} is not a network such as 10.244.0.0/24") from None
        text = ",".join(str(n) for n in networks)
        if text == self.pod_cidr:
            return
        write_json_atomic(self._runtime_config_path, {"pod_cidr": text})
        log.info("pod CIDR is now %s; the CNI config in %s still decides the pods' addresses (no config template)",
                 text, self.cni.conf_dir if self.cni is not None else "(none)")
