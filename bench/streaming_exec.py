"""crictl exec round trips through podshimd: ExecSync (``exec -s``) beside the streaming Exec, and 100
streaming execs at once (every one must succeed; podshimd's open fds and tasks before and after); then
``crictl exec -it`` (a terminal, through the runtime's console socket) in a pod of each runtime handler,
under script(1), beside script(1) running ``true`` alone, and podshimd's open fds before and after.

    python bench/streaming_exec.py [--runs 30] [--concurrent 100] [--tty-runs 15]

As root. Runs its own podshimd (as tests/support/critools.py's ``running_podshimd``: everything under a
temporary directory, removed at the end) with one pod (loopback-only netns, no CNI config) and one
container (``sleep``) on the host's root filesystem. containerd is not run here (its CRI exec needs
an image with a shell imported into it): the figure stands alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import bench_podshimd, percentile
from support.critools import cri_tool
from support.podtools import container_config, pod_config


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True,
                   timeout=60)
    return time.perf_counter() - start


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument("--tty-runs", type=int, default=15)
    args = parser.parse_args(argv)
    crictl = cri_tool("crictl")
    directory = tempfile.mkdtemp(prefix="psd-bench-")
    problems: list[str] = []
    try:
        with bench_podshimd(directory, crictl, problems) as daemon:
            base = [crictl, "--runtime-endpoint", daemon.endpoint, "--timeout", "30s"]
            pod_path, ctr_path = os.path.join(directory, "pod.json"), os.path.join(directory, "ctr.json")
            with open(pod_path, "w") as f:
                json.dump(pod_config(), f)
            with open(ctr_path, "w") as f:
                json.dump(container_config(["sleep", "3600"]), f)
            pod_id = subprocess.run(base + ["runp", pod_path], capture_output=True, text=True, check=True).stdout.strip()
            try:
                cid = subprocess.run(base + ["create", pod_id, ctr_path, pod_path], capture_output=True, text=True,
                                     check=True).stdout.strip()
                subprocess.run(base + ["start", cid], capture_output=True, check=True)
                for _ in range(3):  # warm both paths (imports, the shim's first Task call)
                    timed(base + ["exec", "-s", cid, "true"])
                    timed(base + ["exec", cid, "true"])
                figures: dict[str, list[float]] = {"exec -s true (ExecSync)": [], "exec true (streaming)": []}
                for _ in range(args.runs):  # interleaved, so both see the same machine
                    figures["exec -s true (ExecSync)"].append(timed(base + ["exec", "-s", cid, "true"]))
                    figures["exec true (streaming)"].append(timed(base + ["exec", cid, "true"]))
                for name, values in figures.items():
                    print(f"crictl {name:28s} median {percentile(values, 50) * 1000:6.1f} ms   "
                          f"p90 {percentile(values, 90) * 1000:6.1f} ms   ({len(values)} runs)")
                pid = daemon.process.pid
                fds_before = open_fds(pid)
                failures: list[str] = []

                def one() -> None:
                    done = subprocess.run(base + ["exec", cid, "sh", "-c", "echo hi"], stdin=subprocess.DEVNULL,
                                          capture_output=True, timeout=120)
                    if done.returncode != 0 or done.stdout != b"hi\n":
                        failures.append(done.stderr.decode()[-200:])

                threads = [threading.Thread(target=one) for _ in range(args.concurrent)]
                start = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                elapsed = time.perf_counter() - start
                print(f"{args.concurrent} streaming execs at once: {args.concurrent - len(failures)} succeeded in "
                      f"{elapsed:.1f} s; podshimd fds {fds_before} before, {open_fds(pid)} after")
                for failure in failures[:3]:
                    print("  failed:", failure)
            finally:
                subprocess.run(base + ["rmp", "-f", pod_id], capture_output=True)
            tty_figures(base, directory, daemon.process.pid, args.tty_runs)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        for problem in problems:
            print("cleanup problem:", problem)
    return 0


def tty_figures(base: list[str], directory: str, podshimd_pid: int, runs: int) -> None:
    """``crictl exec -it CID true`` under script(1), per runtime handler, beside ``script true``."""
    def script(command: str) -> list[str]:
        return ["script", "-qec", command, "/dev/null"]

    floor = [timed(script("true")) for _ in range(runs)]
    print(f"script(1) running true alone          median {percentile(floor, 50) * 1000:6.1f} ms")
    pod_path, ctr_path = os.path.join(directory, "pod.json"), os.path.join(directory, "ctr.json")
    for handler in ("native", "runc", "crun"):
        if handler != "native" and shutil.which(handler) is None:
            continue
        pod_id = subprocess.run(base + ["runp", "--runtime", handler, pod_path], capture_output=True, text=True,
                                check=True).stdout.strip()
        try:
            cid = subprocess.run(base + ["create", pod_id, ctr_path, pod_path], capture_output=True, text=True,
                                 check=True).stdout.strip()
            subprocess.run(base + ["start", cid], capture_output=True, check=True)
            command = " ".join(base + ["exec", "-it", cid, "true"])
            timed(script(command))  # warm: the handler's first exec
            fds_before = open_fds(podshimd_pid)
            values = [timed(script(command)) for _ in range(runs)]
            print(f"crictl exec -it true under script, {handler:6s} median {percentile(values, 50) * 1000:6.1f} ms   "
                  f"p90 {percentile(values, 90) * 1000:6.1f} ms   ({runs} runs); podshimd fds {fds_before} before, "
                  f"{open_fds(podshimd_pid)} after")
        finally:
            subprocess.run(base + ["rmp", "-f", pod_id], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
