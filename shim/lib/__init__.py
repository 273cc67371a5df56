"""Helpers the shim and its clients both use that are not the wire: the standard library only
(and the wire's errors), no state of the shim's.

- ``files``: atomic writes, private directories, JSON documents read with limits;
- ``trees``: walking and removing trees of any depth; ``mountinfo``: /proc/PID/mountinfo;
- ``mountcalls``: the mount system calls; ``rootfs``: a root filesystem's mounts made and undone on
  the host (a task's root, an image volume), a path resolved inside a root;
- ``processes``: a process named by pid and start time, its pidfd, its /proc status;
- ``capabilities``: capabilities by name and a process's sets; ``idmaps``: a user namespace's
  mappings and its view for id-mapped mounts; ``namespaces``: a namespace file opened, a thread
  moved into a netns and back, a socket made there;
- ``arguments``: the commands' argument parser; ``program``: how a podshim program starts another,
  ends, goes on running, and maps its errors to an exit status; ``notify``: sd_notify and LISTEN_FDS;
- ``console`` and ``pipes``: a terminal's pty and the one pipe reader, for exec and attach streams;
- ``podfiles``: a pod's /etc/hosts, /etc/resolv.conf and /etc/hostname, written for the pod layer's
  pods and for those containerd's CRI gives the containerd shim.
"""
