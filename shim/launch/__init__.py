"""How a shim process comes to be.

- ``shim.launch.spawn``     binding the socket, forking a detached shim, the bootstrap.
- ``shim.launch.template``  the preloaded template that forks shims without a Python start-up.
"""
