"""How a shim process comes to be.

- ``shim.launch.spawn``     binding the socket, forking a detached shim, the bootstrap.
- ``shim.launch.template``  the preloaded template that forks shims without a Python start-up.
- ``shim.launch.notify``    sd_notify and LISTEN_FDS for shims run by systemd.
"""
