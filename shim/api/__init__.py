"""The contract the shim and its clients share: names, identifiers, paths and defaults, no I/O.

- ``names``: services, methods, the files a bundle holds, environment names, default roots;
- ``identifiers``: containerd's identifier rules, CRI's limits on hostnames, labels and annotations;
- ``paths``: a shim's socket address, the template's control socket;
- ``handlers``: runtime handlers and namespace modes; ``topics``: event topics;
- ``cgroups``: the cgroup drivers' names and which cgroup parent suits each;
- ``defaults``: what both sides fall back to (the pause, a container's capabilities).

Cheap to import: the standard library and :mod:`shim.rpc.status` (its errors) only. A client of the
shim imports this, the wire (:mod:`shim.rpc`) and :mod:`shim.lib`, never the shim's internals.
"""
