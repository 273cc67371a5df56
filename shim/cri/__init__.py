"""The CRI contract the shim and its clients share: CRI's v1 schema and what a CRI config means to
podshim, with no state and no I/O beyond reading a node file a config names.

- ``api``: CRI v1's generated protobuf and gRPC code, compiled at install from the pinned
  k8s.io/cri-api (never committed);
- ``configs``: PodSandboxConfig and ContainerConfig as frozen dataclasses, read from crictl's JSON
  (or a message's dict) with every field checked, and turned into the shim's sandbox options;
- ``requests``: RunPodSandbox's and CreateContainer's configs read from their protobuf messages;
- ``fields``: every field of those two configs and whether podshim applies it, informs or refuses it;
- ``security``: a LinuxContainerSecurityContext as Task.Create's confinement, as containerd's CRI
  decides it (``seccomp_default``: the RuntimeDefault seccomp profile);
- ``resources``: LinuxContainerResources as the shim's ``resources``; ``cdinames``: CDI device names.

Both sides read a pod's config with these modules: podshimd's pod layer (:mod:`client.cri`) and the
containerd shim's CreateSandbox (:mod:`shim.containerd.services`), so a pod means the same whichever
drives it. This package imports only the contract (:mod:`shim.api`), the wire's errors and
:mod:`shim.lib`, never the shim's internals or :mod:`client`.
"""
