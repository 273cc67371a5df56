"""What podshimd tells operators: each CRI call's log lines name its pod and container, and, when
``metrics_address`` is set, a Prometheus endpoint at ``http://<metrics_address>/metrics``.

:func:`observed` wraps every handler (``server.compose`` does it): the call's ``pod_sandbox_id``
and ``container_id`` are put on every line it logs (:mod:`client.cri.logcontext`). With the
endpoint on, :func:`finished` (the gRPC server's hook, called as each call ends with its status)
counts its latency and outcome by method. The endpoint is prometheus_client's
own HTTP server (a thread), with podshimd's metrics in a registry of their own:

- ``podshimd_cri_request_duration_seconds{method}`` histogram of unary CRI calls, seconds;
- ``podshimd_cri_requests_total{method,code}`` counter of finished calls by gRPC status code;
- ``podshimd_pods{state}`` and ``podshimd_containers{state}``, the pods and containers podshimd
  holds by CRI state, read from the pod store at each scrape;
- ``podshimd_pod_starts{state}``, the RunPodSandbox calls ``running`` and ``waiting`` for their
  turn (``max_parallel_pod_starts``);
- the process's own figures (``process_*``, ``python_*``), as every Prometheus client exports them.

prometheus_client is imported only when the endpoint is started: a daemon without it pays nothing.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from shim.rpc.status import Code

from client.cri.logcontext import about

if TYPE_CHECKING:
    from client.cri.pod import PodService
    from client.cri.store import PodStore

    from .handlers import Changes

__all__ = ["MetricsEndpoint", "finished", "observed", "start"]

log = logging.getLogger("podshimd")

#: Latency buckets (seconds): from a status read to a RunPodSandbox with CNI on a loaded node.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# Set while an endpoint runs: records one finished call (method, seconds or None, code name).
_record: Callable[[str, float | None, str], None] | None = None


def _ids(request: Any) -> about:
    return about(getattr(request, "pod_sandbox_id", "") or "", getattr(request, "container_id", "") or "")


def finished(path: str, seconds: float | None, code: Code) -> None:
    """A call of ``path`` (``/package.Service/Method``) ended with ``code`` after ``seconds`` (None:
    a server stream, counted without a latency): counted while the endpoint runs."""
    if _record is not None:
        _record(path.rpartition("/")[2], seconds, code.name)


def observed(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a CRI handler: its log lines carry the ids of its request."""
    if inspect.isasyncgenfunction(handler):
        @functools.wraps(handler)
        async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            with _ids(request):
                async for item in handler(self, request, context):
                    yield item
        return stream

    @functools.wraps(handler)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        with _ids(request):
            return await handler(self, request, context)
    return unary


class MetricsEndpoint:
    """A running endpoint; :meth:`close` stops it. ``address`` is where it listens (HOST:PORT,
    the port the kernel gave for port 0)."""

    def __init__(self, server: Any, thread: Any, address: str):
        self._server = server
        self._thread = thread
        self.address = address

    def close(self) -> None:
        """Stop serving and stop counting. Idempotent."""
        global _record
        _record = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None


def start(address: str, pods: PodService, changes: Changes) -> MetricsEndpoint:
    """Serve ``/metrics`` on ``address`` (HOST:PORT; an IPv6 host in brackets) for the pod layer
    ``pods`` and the pod changes in flight, ``changes``. Raises OSError when the address cannot be
    bound."""
    import prometheus_client
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    global _record
    registry = prometheus_client.CollectorRegistry(auto_describe=True)
    for collector in (prometheus_client.ProcessCollector, prometheus_client.PlatformCollector,
                      prometheus_client.GCCollector):
        collector(registry=registry)
    latency = prometheus_client.Histogram("podshimd_cri_request_duration_seconds",
                                          "Latency of unary CRI calls, by method.", ["method"], buckets=BUCKETS,
                                          registry=registry)
    calls = prometheus_client.Counter("podshimd_cri_requests", "CRI calls finished, by method and gRPC status "
                                      "code.", ["method", "code"], registry=registry)

    class Counts(Collector):
        """Pods and containers by CRI state, read from the pod store at each scrape (in the
        endpoint's thread: the store only reads files there)."""

        def collect(self) -> Iterator[GaugeMetricFamily]:
            pods = GaugeMetricFamily("podshimd_pods", "Pod sandboxes, by CRI state.", labels=["state"])
            containers = GaugeMetricFamily("podshimd_containers", "Containers, by CRI state.", labels=["state"])
            pod_counts = {"SANDBOX_READY": 0, "SANDBOX_NOTREADY": 0}
            container_counts = {f"CONTAINER_{s}": 0 for s in ("CREATED", "RUNNING", "EXITED", "UNKNOWN")}
            for record in pods_store().list():
                if record.state == "CREATING":
                    continue  # not a pod yet: CRI never lists it
                pod_counts["SANDBOX_READY" if record.state == "READY" else "SANDBOX_NOTREADY"] += 1
                for container in record.containers.values():
                    container_counts[f"CONTAINER_{container.state}"] += 1
            for state, count in pod_counts.items():
                pods.add_metric([state], count)
            for state, count in container_counts.items():
                containers.add_metric([state], count)
            yield pods
            yield containers
            starts = GaugeMetricFamily("podshimd_pod_starts", "RunPodSandbox calls running, and waiting for their "
                                       "turn (max_parallel_pod_starts).", labels=["state"])
            starts.add_metric(["running"], changes.starts_running)  # ints, read from this thread: whole values
            starts.add_metric(["waiting"], changes.starts_waiting)
            yield starts

    def pods_store() -> PodStore:
        return pods.store

    registry.register(Counts())
    host, _, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    server, thread = prometheus_client.start_http_server(int(port), addr=host, registry=registry)
    bound_host, bound_port = server.socket.getsockname()[:2]  # an AF_INET or AF_INET6 socket: (host, port, ...)
    bound = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"

    def record(method: str, seconds: float | None, code: str) -> None:
        if seconds is not None:
            latency.labels(method).observe(seconds)
        calls.labels(method, code).inc()

    _record = record
    log.info("Prometheus metrics on http://%s/metrics", bound)
    return MetricsEndpoint(server, thread, bound)
