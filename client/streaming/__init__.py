"""podshimd's streaming server: Exec, Attach and PortForward over SPDY/3.1, as Kubernetes speaks them.

The CRI calls return a URL with a one-time token (:mod:`.tokens`); the client (crictl, kubelet's
proxy) upgrades an HTTP/1.1 request on it to SPDY/3.1 (:mod:`.upgrade`) and then speaks
``portforward.k8s.io`` or ``channel.k8s.io`` over SPDY streams. The protocol code is sans-IO
(:mod:`.spdy`: frames, header compression, stream ids, flow-control windows); :mod:`.server` is the
thin asyncio transport under it, and :mod:`.portforward` the one session kind that touches sockets
in a pod's network namespace. :mod:`.client` is the other end, blocking and without asyncio (podshimctl's
``exec -i/-t``, ``attach``, ``port-forward``).
"""
