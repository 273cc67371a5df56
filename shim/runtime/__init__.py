"""How a process becomes a sandbox's pause or a container.

- ``shim.runtime.process``  the native launcher: fork into namespaces and a cgroup, exec.
- ``shim.runtime.pause``    what the pause task needs (catatonit or the built-in pause).
- ``shim.runtime.oci``      the OCI backends: runc and crun.
- ``shim.runtime.crilog``   CRI-format log files for a container's stdout and stderr.
"""
