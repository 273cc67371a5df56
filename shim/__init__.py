"""podshim: the per-sandbox shim daemon.

Layout (data flows one way, top to bottom):

- ``shim.api``      the contract shared with clients: names, identifiers, paths, handlers, topics, defaults (no I/O).
- ``shim.rpc``      the wire: sans-IO frame codec, messages, status codes, server and client.
- ``shim.lib``      helpers shared with clients that are not the wire: files, trees, processes, console, ...
- ``shim.sandbox.service``  RPC handlers; they translate requests into calls on the sandbox.
- ``shim.sandbox.sandbox``  the state machine of one sandbox.
- ``shim.runtime.pause``, ``shim.kernel.netns``, ``shim.kernel.cgroups``, ``shim.kernel.reaper``: the kernel objects.
"""

__version__ = "0.1.0"
