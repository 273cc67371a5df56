"""podshimd: a CRI v1 runtime (``runtime.v1`` over gRPC on a Unix socket) over podshim's pod layer.

- ``client.podshimd.config``  /etc/podshim/config.toml: every key, its default, its validation, the flags.
- ``client.podshimd.server``  the gRPC server: Version and Status so far, UNIMPLEMENTED for the rest.

Run it as ``python3 -m client.podshimd [--config FILE] [--listen unix:///PATH] ...``.
"""
