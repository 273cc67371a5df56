"""A pod's /etc/hosts, /etc/resolv.conf and /etc/hostname: written at RunPodSandbox into the pod's
own directory, bind-mounted into every container of the pod, removed with the pod.

What goes in them is what kubelet and containerd's CRI plugin (``setupSandboxFiles``) write:

- **hostname**: the pod's hostname, or the node's when the config names none (the pod's UTS
  namespace then keeps the node's name too), and a newline.
- **hosts**: for a pod with its own network, kubelet's managed hosts file: the localhost lines and
  one line per pod IP naming the pod's hostname. A pod on the node's network gets a copy of the
  node's /etc/hosts (kubelet and containerd both do so); so does every pod with ``node_hosts``
  (containerd's CRI copies the node's for every pod: podshim's shim under containerd does too).
- **resolv.conf**: ``search``, ``nameserver`` and ``options`` lines from the pod's DNSConfig
  (containerd's ``parseDNSOptions``); when it gives none of them, a copy of the node's
  /etc/resolv.conf.

The content functions are pure; :func:`write_pod_files` and :func:`remove_pod_files` do the I/O.
Both sides write them: podshimd's pod layer for its pods, the containerd shim for the pods
containerd's CRI gives it; each hands in its pod config as :class:`PodNames` reads it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from shim.lib.files import ensure_private_dir, write_atomic
from shim.lib.trees import remove_tree

__all__ = ["ETC_HOSTNAME", "ETC_HOSTS", "ETC_RESOLV_CONF", "HOST_HOSTS", "HOST_RESOLV_CONF", "HOSTS_HEADER",
           "DnsSettings", "PodFiles", "PodNames", "hostname_content", "hosts_content", "resolv_conf_content",
           "remove_pod_files", "write_pod_files"]

#: Where each file is seen inside a container.
ETC_HOSTS = "/etc/hosts"
ETC_RESOLV_CONF = "/etc/resolv.conf"
ETC_HOSTNAME = "/etc/hostname"
#: The node's own files, copied when the pod's config leaves them to the node.
HOST_HOSTS = "/etc/hosts"
HOST_RESOLV_CONF = "/etc/resolv.conf"
#: The first line of a hosts file podshim writes (kubelet's says "Kubernetes-managed").
HOSTS_HEADER = "# podshim-managed hosts file."
#: kubelet's localhost lines (pkg/kubelet/kubelet_pods.go, managedHostsHeader).
_LOCALHOST_LINES = (
    "127.0.0.1\tlocalhost",
    "::1\tlocalhost ip6-localhost ip6-loopback",
    "fe00::0\tip6-localnet",
    "fe00::0\tip6-mcastprefix",
    "fe00::1\tip6-allnodes",
    "fe00::2\tip6-allrouters",
)
#: The files' mode: every user in a container reads them (a container may run as any uid).
_FILE_MODE = 0o644


class DnsSettings(Protocol):
    """What the files read of a pod's DNSConfig (the pod layer's ``DnsConfig``)."""

    @property
    def servers(self) -> tuple[str, ...]: ...

    @property
    def searches(self) -> tuple[str, ...]: ...

    @property
    def options(self) -> tuple[str, ...]: ...


class PodNames(Protocol):
    """What the files read of a pod's config (the pod layer's ``PodSandboxConfig``)."""

    @property
    def hostname(self) -> str: ...

    @property
    def host_network(self) -> bool: ...

    @property
    def dns_config(self) -> DnsSettings: ...


def hostname_content(hostname: str) -> str:
    """/etc/hostname for ``hostname`` (the node's when empty, as containerd)."""
    return (hostname or socket.gethostname()) + "\n"


def hosts_content(hostname: str, ips: Iterable[str]) -> str:
    """kubelet's managed /etc/hosts: the localhost lines, then ``<ip>\\t<hostname>`` for each of
    the pod's ``ips`` (none for a pod without a network address)."""
    name = hostname or socket.gethostname()
    lines = [HOSTS_HEADER, *_LOCALHOST_LINES, *(f"{ip}\t{name}" for ip in ips if ip)]
    return "\n".join(lines) + "\n"


def resolv_conf_content(dns: DnsSettings) -> str:
    """The resolv.conf a DNSConfig asks for, in containerd's order (search, nameserver, options);
    "" when it sets nothing, which means "the node's resolv.conf"."""
    out = ""
    if dns.searches:
        out += f"search {' '.join(dns.searches)}\n"
    out += "".join(f"nameserver {server}\n" for server in dns.servers)
    if dns.options:
        out += f"options {' '.join(dns.options)}\n"
    return out


@dataclass(frozen=True)
class PodFiles:
    """Where a pod's files are on the node: ``directory`` and the three files in it."""

    directory: str

    @property
    def hosts(self) -> str:
        return os.path.join(self.directory, "hosts")

    @property
    def resolv_conf(self) -> str:
        return os.path.join(self.directory, "resolv.conf")

    @property
    def hostname(self) -> str:
        return os.path.join(self.directory, "hostname")

    def mounts(self) -> dict[str, str]:
        """Container path → node path of every file."""
        return {ETC_HOSTS: self.hosts, ETC_RESOLV_CONF: self.resolv_conf, ETC_HOSTNAME: self.hostname}

    def written(self) -> dict[str, str]:
        """Container path → node path of every file there is: {} for a pod whose files were never
        written."""
        return {path: source for path, source in self.mounts().items() if os.path.exists(source)}


def _read_host_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""  # a node without one: the pod gets an empty one, as a copy of nothing


def write_pod_files(directory: str, cfg: PodNames, ips: Iterable[str] = (), *, node_hosts: bool = False,
                    host_hosts: str = HOST_HOSTS, host_resolv_conf: str = HOST_RESOLV_CONF) -> PodFiles:
    """Write the pod's hosts, resolv.conf and hostname into ``directory`` (made 0711: the files
    are read through it by their bind mounts), each atomically; return where they are. hosts is
    a copy of the node's for a pod on the node's network, or for any with ``node_hosts``. Raises
    OSError when they cannot be written (the caller removes the directory)."""
    ensure_private_dir(directory, 0o711)
    files = PodFiles(directory)
    if cfg.host_network or node_hosts:
        hosts = _read_host_file(host_hosts)
    else:
        hosts = hosts_content(cfg.hostname, ips).encode()
    resolv = resolv_conf_content(cfg.dns_config).encode() or _read_host_file(host_resolv_conf)
    for path, data in ((files.hosts, hosts), (files.resolv_conf, resolv),
                       (files.hostname, hostname_content(cfg.hostname).encode())):
        write_atomic(path, data, mode=_FILE_MODE, durable=False)
    return files


def remove_pod_files(directory: str) -> None:
    """Remove a pod's directory of files; nothing there is no error."""
    remove_tree(directory, ignore_errors=True)
