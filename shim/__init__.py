"""podshim: the per-sandbox shim daemon.

Layout (data flows one way, top to bottom):

- ``shim.rpc``      the wire: sans-IO frame codec, messages, status codes, server and client.
- ``shim.service``  RPC handlers; they translate requests into calls on the sandbox.
- ``shim.sandbox``  the state machine of one sandbox.
- ``shim.pause``, ``shim.netns``, ``shim.cgroups``, ``shim.reaper``: the kernel objects.
"""

__version__ = "0.1.0"
