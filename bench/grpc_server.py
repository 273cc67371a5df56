"""A cheap gRPC call's latency while the server's event loop is busy: grpc.aio's server beside
shim.grpcwire's (podshimd's since it left grpc.aio), the same handler on both.

    python3 bench/grpc_server.py [--calls 200] [--rounds 3] [--tasks 20] [--busy-ms 2] [--hogs 0,2]

Each server runs in a child process (this file, ``--serve KIND``) on uvloop, with ``--tasks``
tasks that each burn ``--busy-ms`` of CPU and then sleep 2 ms, over and over: an event loop as
busy as podshimd's while kubelet starts a hundred pods (its pod changes' steps between awaits).
``--hogs`` processes that spin meanwhile stand for the rest of a loaded node. The client
(grpcio's, in this process) calls CRI's Version one call at a time, 10 ms apart, and records each
call's latency. The two servers take turns, round after round; the table gives the median of
the rounds' p50 and p99, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import uvloop

from bench.common import percentile

READY = "ready"
KINDS = ("grpc.aio", "shim.grpcwire")
GAP_SECONDS = 0.002


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _busy(seconds: float) -> None:
    while True:
        _burn(seconds)
        await asyncio.sleep(GAP_SECONDS)


async def _serve(kind: str, path: str, tasks: int, busy_seconds: float) -> None:
    from shim.cri.api import api_pb2

    async def version(request: object, context: object) -> api_pb2.VersionResponse:
        return api_pb2.VersionResponse(version="0.1.0", runtime_name="bench", runtime_version="1",
                                       runtime_api_version="v1")

    if kind == "grpc.aio":
        import grpc

        from shim.cri.api import api_pb2_grpc

        class Runtime(api_pb2_grpc.RuntimeServiceServicer):
            async def Version(self, request: object, context: object) -> api_pb2.VersionResponse:
                return await version(request, context)

        server = grpc.aio.server()
        api_pb2_grpc.add_RuntimeServiceServicer_to_server(Runtime(), server)
        server.add_insecure_port("unix://" + path)
        await server.start()
    else:
        from shim.grpcwire.aio import Method, Server

        ours = Server({"/runtime.v1.RuntimeService/Version": Method(
            version, api_pb2.VersionRequest.FromString, lambda m: bytes(m.SerializeToString()))})
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(128)
        await ours.start(listener)
    busy = [asyncio.ensure_future(_busy(busy_seconds)) for _ in range(tasks)]
    print(READY, flush=True)
    await asyncio.Event().wait()
    del busy


def _round(kind: str, calls: int, tasks: int, busy_ms: float, hogs: int) -> list[float]:
    """One server's run: the latencies (ms) of ``calls`` sequential Version calls."""
    import grpc

    from shim.cri.api import api_pb2, api_pb2_grpc

    with tempfile.TemporaryDirectory(prefix="grpc-bench-") as directory:
        path = os.path.join(directory, "s.sock")
        server = subprocess.Popen([sys.executable, "-m", "bench.grpc_server", "--serve", kind, path, str(tasks),
                                   str(busy_ms)], stdout=subprocess.PIPE, text=True)
        spinners: list[subprocess.Popen[bytes]] = []
        try:
            assert server.stdout is not None
            if server.stdout.readline().strip() != READY:
                raise SystemExit(f"the {kind} server did not start")
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
            with grpc.insecure_channel("unix://" + path) as channel:
                stub = api_pb2_grpc.RuntimeServiceStub(channel)
                stub.Version(api_pb2.VersionRequest(), timeout=30)
                latencies = []
                for _ in range(calls):
                    started = time.perf_counter()
                    stub.Version(api_pb2.VersionRequest(), timeout=30)
                    latencies.append((time.perf_counter() - started) * 1000)
                    time.sleep(0.01)
            return latencies
        finally:
            for spinner in spinners:
                spinner.send_signal(signal.SIGKILL)
                spinner.wait()
            server.send_signal(signal.SIGKILL)
            server.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tasks", type=int, default=20, help="busy tasks on the server's loop")
    p.add_argument("--busy-ms", type=float, default=2.0, help="CPU each busy task burns between sleeps")
    p.add_argument("--hogs", default="0,2", help="spinning processes beside, one row each (comma-separated)")
    p.add_argument("--serve", nargs=4, metavar=("KIND", "PATH", "TASKS", "BUSY_MS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        kind, path, tasks, busy_ms = args.serve
        uvloop.run(_serve(kind, path, int(tasks), float(busy_ms) / 1000))
        return
    try:
        hog_counts = [int(h) for h in args.hogs.split(",")]
    except ValueError:
        p.error(f"--hogs {args.hogs!r} must be comma-separated counts")
    if args.calls < 10 or args.rounds < 1 or args.tasks < 0 or args.busy_ms < 0 or min(hog_counts) < 0:
        p.error("--calls at least 10, --rounds at least 1, and no negative counts")
    load = os.getloadavg()
    print(f"{args.rounds} rounds of {args.calls} Version calls; server loop: {args.tasks} tasks x {args.busy_ms:g} ms "
          f"CPU then {GAP_SECONDS * 1000:g} ms asleep; load {load[0]:.1f}\n")
    print("| spinning processes | server | p50 (ms) | p99 (ms) |")
    print("|---:|---|---:|---:|")
    for hogs in hog_counts:
        rows: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
        for _ in range(args.rounds):
            for kind in KINDS:
                latencies = _round(kind, args.calls, args.tasks, args.busy_ms, hogs)
                rows[kind].append((percentile(latencies, 50), percentile(latencies, 99)))
        for kind in KINDS:
            p50 = statistics.median(r[0] for r in rows[kind])
            p99 = statistics.median(r[1] for r in rows[kind])
            print(f"| {hogs} | {kind} | {p50:.1f} | {p99:.1f} |")
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
