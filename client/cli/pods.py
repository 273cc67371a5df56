"""crictl's verbs for podshimctl: runp, stopp, rmp, inspectp, pods, create, start, stop, rm,
inspect, ps, logs. Configs are crictl's JSON files; ids may be given by unique prefix.

    podshimctl runp [--runtime native|runc|crun] pod-config.json   # prints the pod id
    podshimctl create POD_ID container-config.json pod-config.json   # prints the container id
    podshimctl start CONTAINER_ID; podshimctl logs CONTAINER_ID
    podshimctl pods [--state ready|notready] [--label k=v] [-q]; podshimctl ps [-a] [--pod ID]
    podshimctl stopp POD_ID; podshimctl rmp POD_ID

Pods live under ``--root`` (records in ROOT/pods, sandbox bundles in ROOT/sandboxes, default
container logs in ROOT/logs), in the Controller namespace ``k8s.io`` as containerd's CRI.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from client.cli.main import EXIT_OK, CliError, _print_fields, _print_table, _read_json_file, command, emit
from client.cri.cni import DEFAULT_BIN_DIRS, DEFAULT_CONF_DIR
from client.cri.pod import DEFAULT_NAMESPACE, PodService, open_pod_service

__all__: list[str] = []

_CRI_LINE = re.compile(r"^(\S+) (stdout|stderr) ([FP]) (.*)$", re.S)


@asynccontextmanager
async def _pods(args: argparse.Namespace) -> AsyncIterator[PodService]:
    bin_dirs = tuple(args.cni_bin_dir.split(":")) if args.cni_bin_dir else DEFAULT_BIN_DIRS
    async with open_pod_service(os.path.abspath(args.root), os.path.abspath(args.runtime_root),
                                cni_conf_dir=args.cni_conf_dir, cni_bin_dirs=bin_dirs,
                                namespace=DEFAULT_NAMESPACE, spawner=args.spawner) as pods:
        yield pods


def _verb(name: str, help: str, run: Callable[[argparse.Namespace, PodService], Any],
          arguments: Callable[[argparse.ArgumentParser], None]) -> None:
    async def runner(args: argparse.Namespace) -> int:
        async with _pods(args) as pods:
            result = await run(args, pods)
        return EXIT_OK if result is None else result

    @command(name, help=help)
    def setup(p: argparse.ArgumentParser) -> None:
        env = os.environ.get
        p.add_argument("--cni-conf-dir", default=env("PODSHIM_CNI_CONF_DIR", DEFAULT_CONF_DIR),
                       help=f"CNI network configs (default {DEFAULT_CONF_DIR})")
        p.add_argument("--cni-bin-dir", default=env("PODSHIM_CNI_BIN_DIR"),
                       help=f"CNI plugin directories, ':'-separated (default {':'.join(DEFAULT_BIN_DIRS)})")
        arguments(p)
        p.set_defaults(run=runner)


def _short(pod_or_container_id: str) -> str:
    return pod_or_container_id[:13]


def _labels(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--label {pair!r} must be KEY=VALUE")
        out[key] = value
    return out


# -- pods -----------------------------------------------------------------------------------
async def _runp(args: argparse.Namespace, pods: PodService) -> None:
    config = _read_json_file(args.config, "pod config")
    pod_id = await pods.run_pod_sandbox(config, runtime_handler=args.runtime)
    emit(args, {"id": pod_id}, lambda out: print(pod_id, file=out))


_verb("runp", "run a pod sandbox from a crictl pod config (prints its id)", _runp,
      lambda p: (p.add_argument("config", metavar="POD_CONFIG.json", help="crictl PodSandboxConfig (- for stdin)"),
                 p.add_argument("--runtime", "-r", default=None,
                                help="runtime handler: native (default), runc or crun")))


async def _each_pod(args: argparse.Namespace, pods: PodService, action: Callable, verb: str) -> None:
    for pod_id in args.ids:
        await action(pod_id)
        if not args.json:
            print(f"{verb} sandbox {pod_id}")


def _ids(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("ids", metavar="ID", nargs="+", help=f"{what} id or unique prefix")


_verb("stopp", "stop pod sandboxes: containers, network, pause", 
      lambda a, pods: _each_pod(a, pods, pods.stop_pod_sandbox, "Stopped"), lambda p: _ids(p, "pod"))
_verb("rmp", "remove pod sandboxes (force-stops ready ones)",
      lambda a, pods: _each_pod(a, pods, pods.remove_pod_sandbox, "Removed"), lambda p: _ids(p, "pod"))


async def _inspectp(args: argparse.Namespace, pods: PodService) -> None:
    status = await pods.pod_sandbox_status(args.id, verbose=True)
    emit(args, status, lambda out: _print_fields(status, out))


_verb("inspectp", "show a pod sandbox's status (with pid, netns, shim address)", _inspectp,
      lambda p: p.add_argument("id", metavar="POD_ID"))

_POD_STATES = {"ready": "SANDBOX_READY", "notready": "SANDBOX_NOTREADY"}


async def _pods_list(args: argparse.Namespace, pods: PodService) -> None:
    found = await pods.list_pod_sandbox({"id": args.id, "state": _POD_STATES.get(args.state),
                                         "label_selector": _labels(args.label)})
    if args.quiet:
        for p in found:
            print(p["id"])
        return
    rows = [{"pod_id": _short(p["id"]), "created_at": p["created_at"], "state": p["state"].split("_", 1)[1],
             "name": p["metadata"].get("name"), "namespace": p["metadata"].get("namespace"),
             "attempt": p["metadata"].get("attempt", 0), "runtime": p["runtime_handler"], "ip": p["ip"]}
            for p in found]
    emit(args, found, lambda out: _print_table(
        rows, ["pod_id", "created_at", "state", "name", "namespace", "attempt", "runtime", "ip"], out))


_verb("pods", "list pod sandboxes", _pods_list,
      lambda p: (p.add_argument("--state", "-s", choices=sorted(_POD_STATES), help="only pods in this state"),
                 p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="label selector"),
                 p.add_argument("--id", default=None, help="only pods whose id starts with this"),
                 p.add_argument("--quiet", "-q", action="store_true", help="print ids only")))


# -- containers ------------------------------------------------------------------------------
async def _create(args: argparse.Namespace, pods: PodService) -> None:
    container = _read_json_file(args.container_config, "container config")
    sandbox = _read_json_file(args.pod_config, "pod config")
    container_id = await pods.create_container(args.pod_id, container, sandbox)
    emit(args, {"id": container_id}, lambda out: print(container_id, file=out))


_verb("create", "create a container in a pod (prints its id)", _create,
      lambda p: (p.add_argument("pod_id", metavar="POD_ID"),
                 p.add_argument("container_config", metavar="CONTAINER_CONFIG.json"),
                 p.add_argument("pod_config", metavar="POD_CONFIG.json")))


async def _each_container(args: argparse.Namespace, action: Callable, verb: str) -> None:
    for container_id in args.ids:
        await action(container_id)
        if not args.json:
            print(container_id if verb == "" else f"{verb} {container_id}")


_verb("start", "start containers", lambda a, pods: _each_container(a, pods.start_container, ""),
      lambda p: _ids(p, "container"))
_verb("stop", "stop containers: SIGTERM, SIGKILL after --timeout",
      lambda a, pods: _each_container(a, lambda c: pods.stop_container(c, a.timeout), ""),
      lambda p: (_ids(p, "container"),
                 p.add_argument("--timeout", "-t", type=float, default=None, metavar="S",
                                help="seconds before SIGKILL (default 10)")))
_verb("rm", "remove containers (force-stops running ones)",
      lambda a, pods: _each_container(a, pods.remove_container, ""), lambda p: _ids(p, "container"))


async def _inspect(args: argparse.Namespace, pods: PodService) -> None:
    status = await pods.container_status(args.id, verbose=True)
    emit(args, status, lambda out: _print_fields(status, out))


_verb("inspect", "show a container's status", _inspect, lambda p: p.add_argument("id", metavar="CONTAINER_ID"))

_CONTAINER_STATES = {"created": "CONTAINER_CREATED", "running": "CONTAINER_RUNNING", "exited": "CONTAINER_EXITED"}


async def _ps(args: argparse.Namespace, pods: PodService) -> None:
    state = _CONTAINER_STATES.get(args.state) if args.state else (None if args.all else "CONTAINER_RUNNING")
    found = await pods.list_containers({"pod_sandbox_id": args.pod, "state": state,
                                        "label_selector": _labels(args.label)})
    if args.quiet:
        for c in found:
            print(c["id"])
        return
    rows = [{"container": _short(c["id"]), "created_at": c["created_at"], "state": c["state"].split("_", 1)[1],
             "name": c["metadata"].get("name"), "attempt": c["metadata"].get("attempt", 0),
             "pod_id": _short(c["pod_sandbox_id"]), "exit_code": c["exit_code"]} for c in found]
    emit(args, found, lambda out: _print_table(
        rows, ["container", "created_at", "state", "name", "attempt", "pod_id", "exit_code"], out))


_verb("ps", "list containers (running ones unless -a)", _ps,
      lambda p: (p.add_argument("--all", "-a", action="store_true", help="every state"),
                 p.add_argument("--pod", "-p", default=None, help="only containers of this pod (id prefix)"),
                 p.add_argument("--state", choices=sorted(_CONTAINER_STATES), help="only this state"),
                 p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE"),
                 p.add_argument("--quiet", "-q", action="store_true", help="print ids only")))


async def _logs(args: argparse.Namespace, pods: PodService) -> int:
    path = pods.container_log_path(args.id)
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = _CRI_LINE.match(line)
                if m is None:
                    continue
                stream = sys.stdout if m.group(2) == "stdout" else sys.stderr
                text = m.group(4)
                if m.group(3) == "P":
                    text = text.rstrip("\n")
                stream.write(f"{m.group(1)} {text}" if args.timestamps else text)
    except FileNotFoundError:
        raise CliError(f"container {args.id} has no log yet ({path})") from None
    sys.stdout.flush()
    return EXIT_OK


_verb("logs", "print a container's log", _logs,
      lambda p: (p.add_argument("id", metavar="CONTAINER_ID"),
                 p.add_argument("--timestamps", "-t", action="store_true", help="show each line's timestamp")))
