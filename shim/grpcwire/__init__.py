"""A small blocking gRPC client for unary calls, over HTTP/2 on a unix socket: podshimctl's wire to
podshimd, without grpcio (whose import alone, with the asyncio it pulls in, would be a large part
of a verb's start-up).

- ``shim.grpcwire.client``  the sans-IO core: gRPC's rules on h2's HTTP/2 connection.
- ``shim.grpcwire.channel``     the blocking socket around it, with the call's deadline.
"""
