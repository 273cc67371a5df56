"""The pod layer: CRI semantics over the Controller's sandboxes.

- ``client.cri.pod``         the pod service, one module per RPC group (sandbox_run, container_create, ...).
- ``client.cri.store``       durable pod and container records (the name reservation).
- ``client.cri.configs``     crictl's JSON configs parsed into frozen dataclasses.
- ``client.cri.cni``         the CNI plugin chain.
- ``client.cri.failpoints``  named crash points for the recovery tests.
"""
