"""How a process becomes a sandbox's pause or a container.

- ``shim.runtime.base``     the Runtime interface a sandbox talks to (start_pause, start_task, kill,
                            delete_task, release, info, record) and a task's spec.
- ``shim.runtime.native``   the ``native`` handler: the shim's own launcher.
- ``shim.runtime.process``  that launcher: fork into namespaces and a cgroup, exec.
- ``shim.runtime.pause``    what the pause task needs (catatonit or the built-in pause).
- ``shim.runtime.oci``      the ``runc`` and ``crun`` handlers: elf, host, rootfs, spec, cli, backend.
- ``shim.runtime.crilog``   CRI-format log files for a container's stdout and stderr.
"""
