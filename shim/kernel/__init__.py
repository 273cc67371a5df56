"""The only code that makes syscalls into namespaces, cgroups and processes.

- ``shim.kernel.linux``    thin syscall wrappers (ctypes): clone flags, setns, prctl, pidfd, ...
- ``shim.kernel.reaper``   the one owner of ``waitpid(-1)``: subscribe before you spawn.
- ``shim.kernel.cgroups``  the sandbox's cgroup in every hierarchy.
- ``shim.kernel.devices``  device rules: the v1 devices controller's and a v2 BPF device program.
- ``shim.kernel.netns``    network namespaces: make, pin, describe, remove.
"""
