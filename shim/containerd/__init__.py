"""containerd's shim protocol on podshim's shim: the ``containerd-shim-podshim-v1`` command
(runtime type ``io.containerd.podshim.v1``) and the protobuf services containerd calls over ttrpc
(``containerd.runtime.sandbox.v1.Sandbox``, ``containerd.task.v3.Task``), mapped onto the shim's
own sandbox and task state machines (docs/containerd.md).
"""
