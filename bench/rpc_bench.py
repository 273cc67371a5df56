"""RPC round-trip latency and pipelined throughput between two processes over a Unix socket.

    python3 bench/rpc_bench.py [--calls 5000] [--pipelined 200000] [--window 1000] [--loops asyncio,uvloop]

For each loop kind the server runs in a child process (this file, ``--serve``) and the client
here, both on that loop. Latency: sequential unary calls with a small payload, after a warm-up.
Throughput: many calls on one connection with ``--window`` of them in flight at once, with the
CPU time each side spent per call (less sensitive than wall time to other load on the machine).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import uvloop

from shim.rpc import CallContext, Client, Server

SERVICE = "bench.v1.Echo"
PAYLOAD = {"sandbox_id": "sb1"}
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
WARMUP_CALLS = 500
READY = b"ready\n"


async def echo(ctx: CallContext, payload: Any) -> Any:
    return payload


async def serve(path: str) -> None:
    """Serve Echo on ``path``; say READY on stdout once accepting; stop at EOF on stdin."""
    server = Server()
    server.register(SERVICE, unary={"Echo": echo})
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(128)
    await server.start(sock)
    loop = asyncio.get_running_loop()
    stdin = sys.stdin.fileno()
    parent_done = loop.create_future()

    def on_stdin() -> None:
        if not os.read(stdin, 1) and not parent_done.done():  # EOF: the parent closed its end
            parent_done.set_result(None)

    loop.add_reader(stdin, on_stdin)
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    try:
        await parent_done
    finally:
        loop.remove_reader(stdin)
        await server.aclose()


async def latencies_us(client: Client, calls: int) -> list[float]:
    for _ in range(WARMUP_CALLS):
        await client.call(SERVICE, "Echo", PAYLOAD)
    samples = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        start = clock()
        await client.call(SERVICE, "Echo", PAYLOAD)
        samples.append((clock() - start) / 1000)
    return samples


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def pipelined(client: Client, server_pid: int, calls: int, window: int) -> tuple[float, float, float]:
    """Calls per second, and client and server CPU µs per call."""
    async def worker(n: int) -> None:
        for _ in range(n):
            await client.call(SERVICE, "Echo", PAYLOAD)

    await asyncio.gather(*(worker(WARMUP_CALLS // window + 1) for _ in range(window)))
    calls = calls // window * window
    start, client_cpu, server_cpu = time.perf_counter(), time.process_time(), cpu_seconds(server_pid)
    await asyncio.gather(*(worker(calls // window) for _ in range(window)))
    elapsed = time.perf_counter() - start
    return (calls / elapsed, (time.process_time() - client_cpu) / calls * 1e6,
            (cpu_seconds(server_pid) - server_cpu) / calls * 1e6)


async def measure(address: str, server_pid: int, args: argparse.Namespace) -> tuple[list[float], tuple[float, float, float]]:
    async with await Client.connect(address) as client:
        samples = await latencies_us(client, args.calls)
        throughput = await pipelined(client, server_pid, args.pipelined, args.window)
    return samples, throughput


def run_one(kind: str, args: argparse.Namespace) -> tuple[list[float], tuple[float, float, float]]:
    with tempfile.TemporaryDirectory(prefix="rpc-bench-") as directory:
        path = os.path.join(directory, "rpc.sock")
        server = subprocess.Popen([sys.executable, __file__, "--serve", path, "--loop", kind],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert server.stdin is not None and server.stdout is not None  # (PIPE)
        try:
            if server.stdout.readline() != READY:
                raise RuntimeError(f"the {kind} server did not start")
            with asyncio.Runner(loop_factory=LOOPS[kind]) as runner:
                result = runner.run(measure(f"unix://{path}", server.pid, args))
        finally:
            server.stdin.close()  # tells the server to stop
            server.wait(timeout=10)
            server.stdout.close()
        if server.returncode != 0:
            raise RuntimeError(f"the {kind} server exited with status {server.returncode}")
        return result


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000, help="sequential calls timed for latency")
    parser.add_argument("--pipelined", type=int, default=200_000, help="calls for the throughput run")
    parser.add_argument("--window", type=int, default=1000, help="calls in flight at once")
    parser.add_argument("--loops", default=",".join(LOOPS), help="loop kinds to measure, comma-separated")
    parser.add_argument("--serve", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        with asyncio.Runner(loop_factory=LOOPS[args.loop]) as runner:
            runner.run(serve(args.serve))
        return

    print(f"{args.calls} sequential calls after {WARMUP_CALLS} warm-up; {args.pipelined} pipelined calls, "
          f"{args.window} in flight; server in a child process; Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (other load skews every figure)\n")
    print("| loop | p50 µs | p99 µs | mean µs | pipelined calls/s | CPU µs/call client | CPU µs/call server |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in args.loops.split(","):
        samples, (rate, client_cpu, server_cpu) = run_one(kind, args)
        print(f"| {kind} | {percentile(samples, 0.50):.1f} | {percentile(samples, 0.99):.1f} | "
              f"{statistics.fmean(samples):.1f} | {rate:,.0f} | {client_cpu:.1f} | {server_cpu:.1f} |", flush=True)


if __name__ == "__main__":
    main()
