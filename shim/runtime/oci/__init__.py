"""OCI runtime backends: runc or crun run a sandbox's pause and its tasks instead of the shim's launcher.

CreateSandbox's ``options.runtime_handler`` chooses who starts the sandbox's processes: ``native`` is
:mod:`shim.runtime.native`; ``runc`` and ``crun`` are the runtime's command line, driven the way containerd's
runc shim drives it: ``create`` (the container's init then waits on the runtime's exec fifo), the shim
places the init in the sandbox cgroup and watches it, ``start``, and at the end ``delete --force``.

- :mod:`~shim.runtime.oci.rootfs`, **the pause rootfs**: ``<runtime root>/pause-rootfs/`` holds
  ``/pause`` and empty ``/proc``, ``/dev`` and ``/sys`` mount points, built once (a temporary directory
  renamed into place, so concurrent shims never see half of it) and used read-only by every sandbox.
  ``/pause`` is a copy of ``/usr/bin/catatonit``, the same pause the native handler runs, in its
  pause mode (``-P``). It is used because Debian builds it **statically** (``file`` says "statically
  linked"): the rootfs holds no libc and no loader, so a dynamically linked pause could not even be
  exec'd there. The build refuses an ELF with an interpreter (PT_INTERP, read by
  :mod:`~shim.runtime.oci.elf`) with FAILED_PRECONDITION, as it refuses a missing catatonit.
- :mod:`~shim.runtime.oci.host`, **facts about this machine**: may a child lower its oom_score_adj,
  is the cgroup layout hybrid, which ``cgroupsPath`` names the sandbox's directories.
- :mod:`~shim.runtime.oci.spec`, **specs**: pure functions that return config.json documents, after
  containerd's sandbox and container specs.
- :mod:`~shim.runtime.oci.cli`, **the runtime's command line** (:class:`~shim.runtime.oci.cli.OciCli`):
  one call per verb with ``--root``, run by :func:`shim.runtime.process.launch` (fork/exec in a new
  session, stdin /dev/null, reaped by the shim's one Reaper), bounded by a named timeout, its errors
  read from its JSON log (``<bundle>/log.json``, as containerd does) into a typed status whose
  sentence is the runtime's own.
- :mod:`~shim.runtime.oci.backend`, **the backend** (:class:`~shim.runtime.oci.backend.OciBackend`,
  a :class:`~shim.runtime.base.Runtime`): what a sandbox with a runc/crun handler owns: the runtime,
  the bundles under ``<shim bundle>/oci/`` and the containers made there, each recorded in state.json
  (through ``persist``) *before* the runtime creates it, so ``podshim delete`` can delete it.

Choices, and why:

- **oom_score_adj.** The pause should get -998 (CRI). Lowering a process's oom_score_adj below the
  shim's needs CAP_SYS_RESOURCE, and an OCI runtime fails the whole create when its write is refused
  (runc: "failed to update /proc/self/oom_score_adj: Permission denied"). So the capability is
  checked up front (bit 24 of CapEff in /proc/self/status): without it and below the shim's own
  value, ``oomScoreAdj`` is left out of config.json, logged, and shown in the verbose status
  (``oci.oom_score_adj``). One create instead of a failed one and a retry; the native launcher
  likewise goes on without it.
- **crun on a hybrid cgroup machine.** crun 1.8 refuses to create anything while the v2 hierarchy of a
  hybrid layout has a controller ("cgroups in hybrid mode not supported") — and it checks before
  asking its cgroup manager, so ``--cgroup-manager=disabled`` alone is not enough. When the layout is
  hybrid (v1 controllers mounted and cgroup2 at /sys/fs/cgroup/unified) ``crun create`` runs in a
  mount namespace of its own where that controller list is /dev/null (the host's own hierarchies are
  never remounted), with ``--cgroup-manager=disabled``, and *inside the sandbox's cgroups*: the shim
  joins crun to them before exec, so crun's container is born there and every page it touches is
  charged there; between create and start the init is written into every cgroup.procs again.
  Trade-off: crun sets no cgroup limits or device rules (the shim applies the device rules to the
  cgroups itself before crun runs, for every handler: :mod:`shim.kernel.devices`), ``crun kill --all`` and ``delete`` cannot
  find processes through cgroups and leave the directories alone — the shim kills through its
  cgroups and removes them itself, which it does for every handler anyway.
- **runc's cgroups.** The shim makes the directories (:class:`~shim.kernel.cgroups.SandboxCgroup`, recorded
  before any process is in them) and gives runc ``cgroupsPath`` as the same path relative to runc's
  own cgroup in each hierarchy — the shim's, as runc is its child — so runc (cgroupfs driver) joins
  the very directories that metrics, kill and cleanup already know. runc's ``delete`` removes them,
  and the shim's removal then finds nothing left to do.
- **Task rootfs.** A task given a ``rootfs`` runs on it as the shim mounted it at Create
  (``<bundle>/tasks/<task id>/rootfs``, :mod:`shim.runtime.mounts`); without one, on a root of its
  own the shim mounted there (``mounts.OWN_ROOT``, an empty tmpfs the runtime makes its mount
  points in, then read-only by ``root.readonly``). A task's /dev/shm is the pod's: the launcher of
  ``create`` takes a copy of the pause's /dev/shm from the pause's mount namespace (``open_tree``)
  and binds it on ``<task bundle>/shm`` in a mount namespace made for the create only (the
  container's is copied from it, and nothing is mounted in the host's), where the config's bind of
  it finds it.
  containerd instead mounts a tmpfs on the host and binds it into every container, which would be a
  host mount for the shim to own.
- **Exits.** The container's init is the shim's child once the runtime has exited (the shim is a
  child subreaper), so the shim's Reaper reports its exit as for native processes: the code, or
  128 + the signal. The shim signals processes by pidfd, as for native ones.

Importing this package imports none of its modules: a shim imports the backend only when a
sandbox chooses runc or crun (the template preloads it, so a forked shim never imports it).
"""
