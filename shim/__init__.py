"""podshim: the per-sandbox shim daemon.

Layout (data flows one way, top to bottom):

- ``shim.rpc``      the wire: sans-IO frame codec, messages, status codes, server and client.
- ``shim.sandbox.service``  RPC handlers; they translate requests into calls on the sandbox.
- ``shim.sandbox.sandbox``  the state machine of one sandbox.
- ``shim.runtime.pause``, ``shim.kernel.netns``, ``shim.kernel.cgroups``, ``shim.kernel.reaper``: the kernel objects.
"""

__version__ = "0.1.0"
