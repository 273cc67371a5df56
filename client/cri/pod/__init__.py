"""Pods with CRI semantics, on top of the Controller: RunPodSandbox and friends, and containers.

The flow follows containerd's CRI plugin (internal/cri/server/sandbox_*.go):

- **run**: record the pod (state CREATING — the record *is* the name reservation), create and
  start its sandbox through the Controller (the shim makes the pod's network namespace), set up
  the network with CNI, then mark it READY with its IP. Any failure rolls back every step; a
  crash leaves a CREATING record that the next start rolls back (containerd#10848 is the
  counter-example: a crash between two writes made every later start fail).
- **stop**: stop every container (best effort), tear the network down (CNI DEL, idempotent),
  stop the sandbox: NOTREADY. Idempotent; works when the shim is already dead.
- **remove**: force-stop if READY, remove the containers, make sure DEL ran, shut the shim down
  (it removes the netns and cgroup), delete the record. Idempotent: NOT_FOUND only for an id
  never seen.

Containers are tasks of the pod's shim (``podshim.task.v1.Task``): processes that join the
pause's net, ipc and uts namespaces (and its pid namespace when the pid mode is POD), on a
writable snapshot of their image (:mod:`client.cri.rootfs`), with the process their image's config and
CRI config make (:mod:`client.cri.process`), the pod's hosts, resolv.conf and hostname files
(:mod:`shim.lib.podfiles`) and their CRI mounts (:mod:`client.cri.mounts`).

The pod service is one class, :class:`PodService` (``service``), made of one part per RPC group,
as containerd's CRI server has one file per RPC or small group:

- ``base``: the shared state, the lookups and the constants; ``recovery``: start-up; ``follow``: the shims' events;
- ``sandbox_run``, ``sandbox_stop``, ``sandbox_remove``, ``sandbox_status``, ``sandbox_list``;
- ``container_create``, ``container_start``, ``container_stop``, ``container_remove``, ``container_status``,
  ``container_list``, ``container_update``;
- ``container_exec``: what the streaming RPCs (exec, attach, port-forward) need of the pod layer;
- ``stats`` (stats and metrics), ``images`` (which pods and containers use an image), ``runtime_config``.
"""

from shim.api.handlers import RUNTIME_HANDLERS

from client.cri.pod.base import DEFAULT_NAMESPACE, PodEntry, keep_newest
from client.cri.pod.service import PodService, open_pod_service

__all__ = ["DEFAULT_NAMESPACE", "RUNTIME_HANDLERS", "PodEntry", "PodService", "keep_newest", "open_pod_service"]
