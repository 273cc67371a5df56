"""The pod layer: CRI semantics over the Controller's sandboxes.

- ``client.cri.pod``         the pod service, one module per RPC group (sandbox_run, container_create, ...).
- ``client.cri.store``       durable pod and container records (the name reservation).
- ``client.cri.cdi``         CDI device names resolved with the node's spec files.
- ``client.cri.cni``         the CNI plugin chain.
- ``client.cri.failpoints``  named crash points for the recovery tests.

What a CRI config means (its dataclasses, the field table, the security and resource
translation) is shared with the containerd shim: :mod:`shim.cri`.
"""
