"""The pod service: every RPC group's part in one class, and how it is opened over a root."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from shim.lib.files import ensure_private_dir
from shim.rpc.status import InvalidArgument

from client import layouts
from client.controller import Controller
from client.cri.cni import DEFAULT_BIN_DIRS, DEFAULT_CONF_DIR, CniRunner
from client.cri.pod.base import DEFAULT_NAMESPACE
from client.cri.pod.container_create import ContainerCreate
from client.cri.pod.container_exec import ContainerExec
from client.cri.pod.container_list import ContainerList
from client.cri.pod.container_remove import ContainerRemove
from client.cri.pod.container_start import ContainerStart
from client.cri.pod.container_status import ContainerStatus
from client.cri.pod.container_stop import ContainerStop
from client.cri.pod.container_update import ContainerUpdate
from client.cri.pod.follow import Following
from client.cri.pod.images import ImageUse
from client.cri.pod.recovery import Recovery
from client.cri.pod.runtime_config import RuntimeConfig
from client.cri.pod.sandbox_list import SandboxList
from client.cri.pod.sandbox_remove import SandboxRemove
from client.cri.pod.sandbox_run import SandboxRun
from client.cri.pod.sandbox_status import SandboxStatus
from client.cri.pod.sandbox_stop import SandboxStop
from client.cri.pod.stats import Stats
from client.cri.store import PodStore

__all__ = ["PodService", "open_pod_service"]


class PodService(Recovery, Following, SandboxRun, SandboxStop, SandboxRemove, SandboxStatus, SandboxList,
                 ContainerCreate, ContainerStart, ContainerStop, ContainerRemove, ContainerStatus, ContainerList,
                 ContainerExec, ContainerUpdate, Stats, ImageUse, RuntimeConfig):
    """CRI's RuntimeService for pods and containers, over a Controller and a PodStore.

    Build it with :func:`open_pod_service` (which also opens the Controller and recovers the
    store); every method raises the typed errors of :mod:`shim.rpc.status`. Other processes
    may work on the same root at the same time: an operation on a pod holds the pod's lock
    (:meth:`PodStore.lock_pod`) in this process and across processes, reads take no lock.
    """


@asynccontextmanager
async def open_pod_service(root: str = "/var/lib/podshim", runtime_root: str = "/run/podshim", *,
                           cni_conf_dir: str = DEFAULT_CONF_DIR, cni_bin_dirs: tuple[str, ...] = DEFAULT_BIN_DIRS,
                           cni_plugin_netns: str | None = None, namespace: str = DEFAULT_NAMESPACE,
                           spawner: Any = "exec", template: bool | None = None,
                           **options: Any) -> AsyncIterator[PodService]:
    """Open the pod service over ``root``: the Controller's bundles in ``root/sandboxes``, pod
    records in ``root/pods``, default container logs in ``root/logs``. ``root`` is marked as
    podshimd's state root and ``root/sandboxes`` as a bundle root (docs/roots.md); a root marked
    as another layout is refused (FailedPrecondition). Reconnects to live shims
    and recovers the store before yielding; closes connections (never the shims) on exit.
    ``spawner`` and ``template`` are the Controller's; ``options`` are :class:`PodService`'s
    (runtime handlers, cgroup parent, pause binary).
    """
    if not os.path.isabs(root):
        raise InvalidArgument(f"root {root!r} must be an absolute path")
    ensure_private_dir(root, 0o711, keep_mode=True)
    layouts.claim(root, layouts.POD_ROOT)
    bundle_root = os.path.join(root, layouts.SANDBOXES_DIR)
    ensure_private_dir(bundle_root, 0o711, keep_mode=True)
    layouts.claim(bundle_root, layouts.BUNDLE_ROOT)
    # Made here, not as a parent of the first log directory the shim makes: a link planted
    # there would take every pod's default logs elsewhere.
    ensure_private_dir(os.path.join(root, "logs"), 0o755, keep_mode=True)
    store = PodStore(root)
    # No loopback plugin: every pod's netns is its shim's, made with lo up (shim.kernel.netns).
    cni = CniRunner(cni_conf_dir, cni_bin_dirs, plugin_netns=cni_plugin_netns, loopback=False)
    async with Controller(state_root=bundle_root, runtime_root=runtime_root,
                          spawner=spawner, template=template) as controller:
        service = PodService(controller, store, cni=cni, namespace=namespace, log_root=os.path.join(root, "logs"),
                             **options)
        # Entered by hand, not with async with: an error of the caller's block must come out as
        # it is, not wrapped in the task group's ExceptionGroup.
        followers = anyio.create_task_group()
        await followers.__aenter__()
        try:
            service.keep_current(followers)
            await service.recover()
            yield service
        finally:
            followers.cancel_scope.cancel()
            await followers.__aexit__(None, None, None)
