"""crictl's verbs for podshimctl, as a client of podshimd: runp, stopp, rmp, inspectp, pods, create,
start, stop, rm, inspect, ps, logs, exec, stats, statsp, and the image verbs pull, images, inspecti,
rmi, imagefsinfo. Configs are crictl's JSON files; ids may
be given by unique prefix.

    podshimctl runp [--runtime native|runc|crun] pod-config.json   # prints the pod id
    podshimctl create [--with-pull] POD_ID container-config.json pod-config.json   # prints the container id
    podshimctl start CONTAINER_ID; podshimctl logs CONTAINER_ID
    podshimctl pods [--state ready|notready] [--label k=v] [-q]; podshimctl ps [-a] [--pod ID]
    podshimctl exec [--timeout S] [-i] [-t] CONTAINER_ID CMD [ARG...]   # exits with the command's status
    podshimctl stats [--pod ID] [-s S]; podshimctl statsp [-s S]
    podshimctl stopp POD_ID; podshimctl rmp POD_ID
    podshimctl pull [--creds USER[:PASS] | --auth BASE64 | --username U [--password P]] IMAGE
    podshimctl images [-q] [IMAGE]; podshimctl inspecti IMAGE; podshimctl rmi IMAGE...; podshimctl imagefsinfo

podshimd is the one writer of the pod store: every verb is a CRI call to it, on ``--endpoint``
(default $PODSHIM_ENDPOINT, else ``unix://RUNTIME_ROOT/podshimd.sock``, podshimd's default
socket). With no daemon there, a verb says how to start one and exits 1. The CRI code and the gRPC wire
(shim.grpcwire, not grpcio) are imported only when a pod verb runs: the shim-level verbs never pay for them.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from shim.rpc.status import Code, NotFound, RpcError, error_from_status

from client.cli.main import EXIT_OK, CliError, _print_table, _read_json_file, command, emit
from client.controller.defaults import podshimd_endpoint

__all__: list[str] = []

_CRI_LINE = re.compile(r"^(\S+) (stdout|stderr) ([FP]) (.*)$", re.S)
ENDPOINT_ENV = "PODSHIM_ENDPOINT"
#: Deadline of one call to podshimd (a RunPodSandbox with CNI, a RemovePodSandbox of a busy pod).
CALL_TIMEOUT = 60.0
#: What a client needs to know when nothing answers on the endpoint.
HOW_TO_START = ("start it with `systemctl start podshimd` (systemd/podshimd.service), or run `podshimd` "
                "as root (it stays in the foreground)")
_UNIX = "unix://"


class _Podshimd:
    """podshimd's RuntimeService and ImageService, one blocking call at a time, its errors as RpcErrors.

    The calls go through shim.grpcwire (h2), not grpcio: importing grpc (and the asyncio it pulls
    in) was half of a verb's start-up (issue #15). One connection serves all calls of a run."""

    def __init__(self, endpoint: str):
        from shim.cri.api import api_pb2
        from shim.grpcwire.channel import Channel

        self.endpoint = endpoint
        self.api = api_pb2
        self._channel = Channel(endpoint[len(_UNIX):])
        self._services = {name: service for service in ("RuntimeService", "ImageService")
                          for name in api_pb2.DESCRIPTOR.services_by_name[service].methods_by_name}

    def call(self, method: str, deadline: float | None = CALL_TIMEOUT, **fields: Any) -> Any:
        """``method`` with a request of ``fields``, within ``deadline`` seconds (None: no deadline); its reply."""
        from google.protobuf.message import DecodeError

        request = getattr(self.api, f"{method}Request")(**fields)
        outcome = self._channel.call(f"/runtime.v1.{self._services[method]}/{method}", request.SerializeToString(),
                                     deadline)
        if outcome.code == Code.UNAVAILABLE and not _answers(self.endpoint):
            raise CliError(f"podshimd stopped answering on {self.endpoint}: {HOW_TO_START}")
        if outcome.code != Code.OK:  # the connection's own failures name the endpoint they came from
            details = outcome.details if outcome.from_server else f"podshimd at {self.endpoint}: {outcome.details}"
            raise error_from_status(outcome.code, details)
        try:
            return getattr(self.api, f"{method}Response").FromString(outcome.message)
        except DecodeError as exc:
            raise error_from_status(Code.INTERNAL, f"podshimd's {method} reply is not a {method}Response: {exc}") from None

    def channel_call(self, method_path: str, request: bytes, deadline: float | None) -> Any:
        """A call of another service on podshimd's socket (``/package.Service/Method``), with the
        serialised ``request``; its grpcwire Outcome (the connection's failures said as :meth:`call` says them)."""
        outcome = self._channel.call(method_path, request, deadline)
        if outcome.code == Code.UNAVAILABLE and not _answers(self.endpoint):
            raise CliError(f"podshimd stopped answering on {self.endpoint}: {HOW_TO_START}")
        if outcome.code != Code.OK and not outcome.from_server:
            return type(outcome)(outcome.code, f"podshimd at {self.endpoint}: {outcome.details}")
        return outcome

    def close(self) -> None:
        self._channel.close()


def _answers(endpoint: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
        s.settimeout(1.0)
        try:
            s.connect(endpoint[len(_UNIX):])
        except OSError:
            return False
    return True


def _endpoint(args: argparse.Namespace) -> str:
    endpoint = args.endpoint or os.environ.get(ENDPOINT_ENV) or podshimd_endpoint(args.runtime_root)
    if not endpoint.startswith(_UNIX) or not endpoint[len(_UNIX):].startswith("/"):
        raise CliError(f"--endpoint must be unix:///ABSOLUTE/PATH, not {endpoint!r}")
    path = endpoint[len(_UNIX):]
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise CliError(f"podshimd is not running: nothing at {path}; {HOW_TO_START}") from None
        raise CliError(f"cannot reach podshimd at {path}: {exc.strerror}") from None
    if not _answers(endpoint):
        raise CliError(f"podshimd is not running: nothing answers on {endpoint}; {HOW_TO_START}")
    return endpoint


def _verb(name: str, help: str, run: Callable[[argparse.Namespace, _Podshimd], Any],
          arguments: Callable[[argparse.ArgumentParser], object]) -> None:
    def runner(args: argparse.Namespace) -> int:  # blocking gRPC calls: no event loop to load
        daemon = _Podshimd(_endpoint(args))
        try:
            result = run(args, daemon)
        finally:
            daemon.close()
        return EXIT_OK if result is None else result

    @command(name, help=help)
    def setup(p: argparse.ArgumentParser) -> None:
        arguments(p)
        p.set_defaults(run_sync=runner)


# -- presentation ------------------------------------------------------------------------------------
OUTPUTS = ("table", "json", "yaml")


def _output_flag(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``p`` with --output (as the other argument helpers, for a verb's one-expression arguments)."""
    p.add_argument("--output", "-o", choices=OUTPUTS, default=None,
                   help="table (the default), or crictl's JSON or YAML document of the list")
    return p


def _listing(args: argparse.Namespace, key: str, items: list[dict[str, Any]],
             table: Callable[[Any], None] | None) -> None:
    """A list verb's answer: -o json/yaml print crictl's document ``{key: items}``; --json the items;
    else the table."""
    if args.output == "json":
        print(json.dumps({key: items}, indent=2, sort_keys=True))
    elif args.output == "yaml":
        sys.stdout.write(_yaml({key: items}))
    else:
        emit(args, items, table)


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _yaml_key(key: Any) -> str:
    return key if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) else json.dumps(str(key))


def _yaml(value: Any, indent: str = "") -> str:
    """``value`` (JSON's types) as YAML block style; strings as JSON strings, which YAML reads alike."""
    if isinstance(value, dict) and value:
        out = []
        for key in sorted(value):
            item = value[key]
            if isinstance(item, (dict, list)) and item:
                out.append(f"{indent}{_yaml_key(key)}:\n{_yaml(item, indent + '  ')}")
            else:
                out.append(f"{indent}{_yaml_key(key)}: {_yaml(item).strip()}\n")
        return "".join(out)
    if isinstance(value, list) and value:
        out = []
        for item in value:
            text = _yaml(item, indent + "  ")
            out.append(f"{indent}- {text[len(indent) + 2:]}" if isinstance(item, (dict, list)) and item
                       else f"{indent}- {text.strip()}\n")
        return "".join(out)
    return f"{indent}{json.dumps(value)}\n"



def _plain(message: Any) -> dict[str, Any]:
    """A CRI message as a dict with its proto field names (the crictl JSON spelling), every field
    shown, enums by name, int64 timestamps as numbers."""
    from google.protobuf import json_format

    doc: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                                    always_print_fields_with_no_presence=True)
    # Proto JSON writes an int64 as a string; the times are ns since the epoch.
    for key in ("created_at", "started_at", "finished_at"):
        if isinstance(doc.get(key), str):
            doc[key] = int(doc[key])
    return doc


def _with_info(status: dict[str, Any], info: Any) -> dict[str, Any]:
    """A status with its verbose ``info`` (podshimd sends it as JSON under the key ``info``)."""
    if "info" in info:
        try:
            status["info"] = json.loads(info["info"])
        except ValueError:
            status["info"] = info["info"]
    return status


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


def _config_doc(path: str, what: str) -> dict[str, Any]:
    doc = _read_json_file(path, what)
    if not isinstance(doc, dict):
        raise CliError(f"{what} {path} must hold a JSON object")
    return doc


def _config(daemon: _Podshimd, path: str, what: str, kind: str, doc: dict[str, Any] | None = None) -> Any:
    """A crictl JSON config file (or its ``doc``) as the CRI message ``kind``; podshimd validates its
    fields. A key that is no field of ``kind`` is refused here, naming it and the field it resembles."""
    from google.protobuf import json_format

    if doc is None:
        doc = _config_doc(path, what)
    _refuse_unknown(doc, path, what, kind)
    message = getattr(daemon.api, kind)()
    _text_as_bytes(message.DESCRIPTOR, doc)
    try:
        return json_format.ParseDict(doc, message)
    except json_format.ParseError as exc:
        raise CliError(f"{what} {path} is not a CRI {kind}: {exc}") from None


def _snake(key: str) -> str:
    """A field's proto name from either JSON spelling (``logDirectory``, ``log_directory``)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def _tables() -> dict[str, Any]:
    from shim.cri import fields

    return {"PodSandboxConfig": fields.POD_SANDBOX_CONFIG, "ContainerConfig": fields.CONTAINER_CONFIG}


def _refuse_unknown(doc: dict[str, Any], path: str, what: str, kind: str) -> None:
    """Refuse a ``doc`` with keys that are no fields of CRI's ``kind``, naming each and the known field it
    most resembles: a field left out would be a pod or container other than the one asked for."""
    import difflib

    from shim.cri import fields

    table = _tables()[kind]
    unknown = []
    for where, field_path, field, _, _ in fields.walk(doc, table, _snake):
        if field is None:
            parent_path, _, name = field_path.rpartition(".")
            siblings = [p.rpartition(".")[2] for p in table if p.rpartition(".")[0] == parent_path]
            close = difflib.get_close_matches(name, siblings, 1)
            unknown.append(f"{where!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if unknown:
        raise CliError(f"{what} {path} is not a CRI {kind}: {', '.join(unknown)} "
                       f"{'is not one of its fields' if len(unknown) == 1 else 'are not among its fields'}")


def _looks_like(doc: dict[str, Any], kind: str) -> list[str]:
    """The fields of ``doc`` that CRI's ``kind`` has and the other config does not."""
    from shim.cri import fields

    tables = _tables()
    other = tables["ContainerConfig" if kind == "PodSandboxConfig" else "PodSandboxConfig"]
    return [where for where, field_path, field, _, _ in fields.walk(doc, tables[kind], _snake)
            if field is not None and field_path not in other]


def _text_as_bytes(descriptor: Any, doc: Any) -> None:
    """crictl's files write a ``bytes`` field (an env value since CRI 1.37) as its text: encoded
    here as protobuf's JSON wants it (base64), so that ``"value": "abcd"`` stays those four letters."""
    import base64

    if not isinstance(doc, dict):
        return
    for key, value in doc.items():
        field = descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        if field is None:
            continue  # ParseDict names it
        if field.type == field.TYPE_BYTES and isinstance(value, str):
            doc[key] = base64.b64encode(value.encode()).decode()
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for item in value if isinstance(value, list) else [value]:
                _text_as_bytes(field.message_type, item)


# -- pods -----------------------------------------------------------------------------------
def _runp(args: argparse.Namespace, daemon: _Podshimd) -> None:
    config = _config(daemon, args.config, "pod config", "PodSandboxConfig")
    pod_id = daemon.call("RunPodSandbox", config=config, runtime_handler=args.runtime or "").pod_sandbox_id
    emit(args, {"id": pod_id}, lambda out: print(pod_id, file=out))


_verb("runp", "run a pod sandbox from a crictl pod config (prints its id)", _runp,
      lambda p: (p.add_argument("config", metavar="POD_CONFIG.json", help="crictl PodSandboxConfig (- for stdin)"),
                 p.add_argument("--runtime", "-r", default=None,
                                help="runtime handler: native (podshimd's default), runc or crun")))


def _each(args: argparse.Namespace, action: Callable[[str], Any], said: Callable[[str], str]) -> None:
    for one_id in args.ids:
        action(one_id)
        if not args.json:
            print(said(one_id))


def _ids(p: argparse.ArgumentParser, what: str) -> argparse.ArgumentParser:
    p.add_argument("ids", metavar="ID", nargs="+", help=f"{what} id or unique prefix")
    return p


_verb("stopp", "stop pod sandboxes: containers, network, pause",
      lambda a, d: _each(a, lambda i: d.call("StopPodSandbox", pod_sandbox_id=i), lambda i: f"Stopped sandbox {i}"),
      lambda p: _ids(p, "pod"))
_verb("rmp", "remove pod sandboxes (force-stops ready ones)",
      lambda a, d: _each(a, lambda i: d.call("RemovePodSandbox", pod_sandbox_id=i), lambda i: f"Removed sandbox {i}"),
      lambda p: _ids(p, "pod"))


def _pod_status(daemon: _Podshimd, pod_id: str, verbose: bool) -> dict[str, Any]:
    reply = daemon.call("PodSandboxStatus", pod_sandbox_id=pod_id, verbose=verbose)
    return _with_info(_plain(reply.status), reply.info)


def _document(args: argparse.Namespace, doc: Any) -> None:
    """An inspect verb's answer: JSON, indented for a person (compact with --json), never a repr."""
    print(json.dumps(doc, sort_keys=True) if args.json else json.dumps(doc, indent=2, sort_keys=True))


def _inspectp(args: argparse.Namespace, daemon: _Podshimd) -> None:
    _document(args, _pod_status(daemon, args.id, verbose=True))


_verb("inspectp", "show a pod sandbox's status (with pid, netns, shim address), as JSON", _inspectp,
      lambda p: p.add_argument("id", metavar="POD_ID"))

_POD_STATES = {"ready": "SANDBOX_READY", "notready": "SANDBOX_NOTREADY"}


def _pods_list(args: argparse.Namespace, daemon: _Podshimd) -> None:
    state = daemon.api.PodSandboxStateValue(state=_POD_STATES[args.state]) if args.state else None
    found = daemon.call("ListPodSandbox", filter=daemon.api.PodSandboxFilter(
        id=args.id or "", state=state, label_selector=_labels(args.label))).items
    if args.quiet:
        for p in found:
            print(p.id)
        return
    pods = [_plain(p) for p in found]
    if args.output in ("json", "yaml"):
        _listing(args, "items", pods, None)
        return
    for pod in pods:  # the IPs are in each pod's status, not in the list
        try:
            pod["ip"] = _pod_status(daemon, pod["id"], verbose=False)["network"]["ip"]
        except RpcError:  # removed meanwhile: show it without
            pod["ip"] = ""
    rows = [{"pod_id": _short(p["id"]), "created_at": p["created_at"], "state": p["state"].split("_", 1)[1],
             "name": p["metadata"].get("name"), "namespace": p["metadata"].get("namespace"),
             "attempt": p["metadata"].get("attempt", 0), "runtime": p["runtime_handler"], "ip": p["ip"]}
            for p in pods]
    _listing(args, "items", pods, lambda out: _print_table(
        rows, ["pod_id", "created_at", "state", "name", "namespace", "attempt", "runtime", "ip"], out))


_verb("pods", "list pod sandboxes", _pods_list,
      lambda p: (p.add_argument("--state", "-s", choices=sorted(_POD_STATES), help="only pods in this state"),
                 p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="label selector"),
                 p.add_argument("--id", default=None, help="only pods whose id starts with this"),
                 p.add_argument("--quiet", "-q", action="store_true", help="print ids only"), _output_flag(p)))


# -- containers ------------------------------------------------------------------------------
def _create(args: argparse.Namespace, daemon: _Podshimd) -> None:
    container_doc = _config_doc(args.container_config, "container config")
    pod_doc = _config_doc(args.pod_config, "pod config")
    as_pod, as_container = _looks_like(container_doc, "PodSandboxConfig"), _looks_like(container_doc, "ContainerConfig")
    if len(as_pod) > len(as_container):
        swapped = " (the files are swapped?)" if _looks_like(pod_doc, "ContainerConfig") else ""
        raise CliError(f"{args.container_config} looks like a pod config ({', '.join(as_pod[:3])}), not a container "
                       f"config{swapped}: podshimctl create POD_ID CONTAINER_CONFIG.json POD_CONFIG.json")
    config = _config(daemon, args.container_config, "container config", "ContainerConfig", container_doc)
    sandbox = _config(daemon, args.pod_config, "pod config", "PodSandboxConfig", pod_doc)
    if args.with_pull:
        if not config.image.image:
            raise CliError(f"--with-pull: container config {args.container_config} names no image")
        _pull_image(daemon, config.image.image, _auth(args), sandbox)
    container_id = daemon.call("CreateContainer", pod_sandbox_id=args.pod_id, config=config,
                               sandbox_config=sandbox).container_id
    emit(args, {"id": container_id}, lambda out: print(container_id, file=out))


_verb("create", "create a container in a pod (prints its id); its config must name an image, its root "
      "filesystem (podshimd runs no container without one)", _create,
      lambda p: (p.add_argument("pod_id", metavar="POD_ID"),
                 p.add_argument("container_config", metavar="CONTAINER_CONFIG.json"),
                 p.add_argument("pod_config", metavar="POD_CONFIG.json"),
                 p.add_argument("--with-pull", action="store_true",
                                help="pull the container config's image first (crictl's --with-pull)"),
                 p.add_argument("--no-pull", action="store_false", dest="with_pull", default=False,
                                help="do not pull the image (the default)"),
                 _auth_arguments(p)))

#: StopContainer's grace when none is given (crictl's is 0: at once; podshimctl's was 10 s).
DEFAULT_STOP_TIMEOUT = 10

_verb("start", "start containers",
      lambda a, d: _each(a, lambda i: d.call("StartContainer", container_id=i), str), lambda p: _ids(p, "container"))
_verb("stop", "stop containers: SIGTERM, SIGKILL after --timeout",
      lambda a, d: _each(a, lambda i: d.call("StopContainer", CALL_TIMEOUT + a.timeout, container_id=i,
                                             timeout=a.timeout), str),
      lambda p: (_ids(p, "container"),
                 p.add_argument("--timeout", "-t", type=int, default=DEFAULT_STOP_TIMEOUT, metavar="S",
                                help=f"seconds before SIGKILL (default {DEFAULT_STOP_TIMEOUT}; 0: at once)")))
_verb("rm", "remove containers (force-stops running ones)",
      lambda a, d: _each(a, lambda i: d.call("RemoveContainer", container_id=i), str), lambda p: _ids(p, "container"))


def _container_status(daemon: _Podshimd, container_id: str, verbose: bool) -> dict[str, Any]:
    reply = daemon.call("ContainerStatus", container_id=container_id, verbose=verbose)
    return _with_info(_plain(reply.status), reply.info)


def _inspect(args: argparse.Namespace, daemon: _Podshimd) -> None:
    _document(args, _container_status(daemon, args.id, verbose=True))


_verb("inspect", "show a container's status, as JSON", _inspect, lambda p: p.add_argument("id", metavar="CONTAINER_ID"))

_CONTAINER_STATES = {"created": "CONTAINER_CREATED", "running": "CONTAINER_RUNNING", "exited": "CONTAINER_EXITED"}


def _ps(args: argparse.Namespace, daemon: _Podshimd) -> None:
    state = _CONTAINER_STATES.get(args.state) if args.state else (None if args.all else "CONTAINER_RUNNING")
    found = daemon.call("ListContainers", filter=daemon.api.ContainerFilter(
        pod_sandbox_id=args.pod or "", label_selector=_labels(args.label),
        state=daemon.api.ContainerStateValue(state=state) if state else None)).containers
    if args.quiet:
        for c in found:
            print(c.id)
        return
    containers = [_plain(c) for c in found]
    for c in containers:  # exit codes are in each container's status, not in the list
        c["exit_code"] = None
        if c["state"] == "CONTAINER_EXITED":
            try:
                c["exit_code"] = _container_status(daemon, c["id"], verbose=False)["exit_code"]
            except RpcError:  # removed meanwhile: show it without
                pass
    if args.output in ("json", "yaml"):
        _listing(args, "containers", containers, None)
        return
    # crictl's columns: the image as the config named it (an id shortened), the pod by its name too.
    pod_names = {p.id: p.metadata.name for p in daemon.call("ListPodSandbox").items} if containers else {}
    rows = [{"container": _short(c["id"]), "image": _image_column(c["image"].get("image", "")),
             "created_at": c["created_at"], "state": c["state"].split("_", 1)[1],
             "name": c["metadata"].get("name"), "attempt": c["metadata"].get("attempt", 0),
             "pod_id": _short(c["pod_sandbox_id"]), "pod": pod_names.get(c["pod_sandbox_id"], ""),
             "exit_code": c["exit_code"]} for c in containers]
    _listing(args, "containers", containers, lambda out: _print_table(
        rows, ["container", "image", "created_at", "state", "name", "attempt", "pod_id", "pod", "exit_code"], out))


def _image_column(image: str) -> str:
    """An image as crictl's tables show it: a name as it is, an id (sha256:…) by its first 13 hex digits."""
    return image.removeprefix("sha256:")[:13] if image.startswith("sha256:") else image


_verb("ps", "list containers (running ones unless -a)", _ps,
      lambda p: (p.add_argument("--all", "-a", action="store_true", help="every state"),
                 p.add_argument("--pod", "-p", default=None, help="only containers of this pod (id prefix)"),
                 p.add_argument("--state", choices=sorted(_CONTAINER_STATES), help="only this state"),
                 p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE"),
                 p.add_argument("--quiet", "-q", action="store_true", help="print ids only"), _output_flag(p)))


#: Seconds between two looks at a followed log (and at its container's state).
FOLLOW_POLL = 0.2
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


def _log_time(stamp: str) -> int | None:
    """A CRI log line's RFC 3339 time as ns since the epoch; None if it is not one."""
    import datetime

    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp)
    if m is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    except ValueError:
        return None
    return int(moment.timestamp()) * 10**9 + int((m.group(2) or "0")[:9].ljust(9, "0"))


def _since(text: str) -> int:
    """--since: an RFC 3339 time, or a duration before now (Go's spelling: 42m, 1h30m, 10s); ns since the epoch."""
    moment = _log_time(text)
    if moment is not None:
        return moment
    if _DURATION.sub("", text) == "" and text:
        ago = sum(int(float(n) * _UNIT_NS[unit]) for n, unit in _DURATION.findall(text))
        return time.time_ns() - ago
    raise CliError(f"--since {text!r} is neither an RFC 3339 time (2026-01-02T13:23:37Z) nor a duration (42m, 1h30m)")


def _log_records(text: str) -> list[tuple[str, str, str, str]]:
    """The (time, stream, tag, text) records of whole CRI log lines in ``text``."""
    records = []
    for line in text.splitlines(keepends=True):
        m = _CRI_LINE.match(line)
        if m is not None:
            records.append((m.group(1), m.group(2), m.group(3), m.group(4)))
    return records


def _show(records: list[tuple[str, str, str, str]], timestamps: bool) -> None:
    for stamp, kind, tag, text in records:
        stream = sys.stdout if kind == "stdout" else sys.stderr
        if tag == "P":
            text = text.rstrip("\n")
        stream.write(f"{stamp} {text}" if timestamps else text)
    sys.stdout.flush()
    sys.stderr.flush()


def _logs(args: argparse.Namespace, daemon: _Podshimd) -> int:
    if args.tail is not None and args.tail < 0:
        raise CliError(f"--tail must be 0 or more lines, not {args.tail}")
    since = _since(args.since) if args.since else None
    status = _container_status(daemon, args.id, verbose=False)
    path = status["log_path"]
    if args.follow:
        from shim.lib.program import long_running

        long_running()  # it prints until the container ends or it is interrupted
    try:
        with open(path, "rb") as f:
            pending = b""

            def records() -> list[tuple[str, str, str, str]]:
                nonlocal pending
                data = pending + f.read()
                whole, newline, pending = data.rpartition(b"\n")
                if not newline:
                    whole, pending = b"", data
                found = _log_records((whole + newline).decode(errors="replace"))
                if since is not None:
                    found = [r for r in found if (_log_time(r[0]) or 0) >= since]
                return found

            first = records()
            if args.tail is not None:
                first = first[len(first) - args.tail:] if args.tail else []
            _show(first, args.timestamps)
            checked = time.monotonic()
            while args.follow:
                more = records()
                _show(more, args.timestamps)
                if more:
                    continue
                if time.monotonic() - checked >= 1.0:  # ended: what it wrote last is in the file
                    checked = time.monotonic()
                    if _container_status(daemon, args.id, verbose=False)["state"] == "CONTAINER_EXITED":
                        _show(records(), args.timestamps)
                        break
                time.sleep(FOLLOW_POLL)
    except FileNotFoundError:
        raise CliError(f"container {args.id} has no log yet ({path})") from None
    except OSError as exc:
        raise CliError(f"cannot read the log of container {args.id} ({path}): {exc.strerror}") from None
    return EXIT_OK


def _logs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="CONTAINER_ID")
    p.add_argument("--timestamps", "-t", action="store_true", help="show each line's timestamp")
    p.add_argument("--follow", "-f", action="store_true", help="go on printing what it writes until it exits (or ^C)")
    p.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines")
    p.add_argument("--since", default=None, metavar="TIME|DURATION",
                   help="only lines since an RFC 3339 time or a duration ago (42m, 1h30m)")
    p.set_defaults(quiet_interrupt=True)


_verb("logs", "print a container's log", _logs, _logs_arguments)


# -- running containers: exec, stats -------------------------------------------------------------
def _exec(args: argparse.Namespace, daemon: _Podshimd) -> int:
    # No deadline of our own without a timeout: the command runs as long as it runs.
    deadline = CALL_TIMEOUT + args.timeout if args.timeout else None
    reply = daemon.call("ExecSync", deadline, container_id=args.id, cmd=args.cmd, timeout=args.timeout)
    if args.json:
        emit(args, {"exit_code": reply.exit_code, "stdout": reply.stdout.decode(errors="replace"),
                    "stderr": reply.stderr.decode(errors="replace")})
    else:
        sys.stdout.buffer.write(reply.stdout)
        sys.stdout.flush()
        sys.stderr.buffer.write(reply.stderr)
        sys.stderr.flush()
    return int(reply.exit_code) & 0xFF


def _size(n: int | None) -> str:
    """Bytes in binary units, as ``12.3MiB``; "-" for a figure the host could not give."""
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"


def _figure(message: Any, field: str) -> int | None:
    return getattr(message, field).value if message.HasField(field) else None


def _cpu_percent(now: Any, before: Any | None) -> str:
    """CPU use between two samples, in % of one CPU (as crictl and top show it)."""
    if before is None or not now.HasField("usage_core_nano_seconds") or not before.HasField("usage_core_nano_seconds"):
        return "-"
    elapsed = now.timestamp - before.timestamp
    if elapsed <= 0:
        return "-"
    used = now.usage_core_nano_seconds.value - before.usage_core_nano_seconds.value
    return f"{max(used, 0) / elapsed * 100:.2f}"


def _sampled(args: argparse.Namespace, list_stats: Callable[[], list[Any]]) -> tuple[list[Any], dict[str, Any]]:
    """Two samples ``args.seconds`` apart (CPU use needs two): the second, and the first by id."""
    if args.seconds <= 0:
        return list_stats(), {}
    first = {s.attributes.id: s for s in list_stats()}
    time.sleep(args.seconds)
    return list_stats(), first


def _stats(args: argparse.Namespace, daemon: _Podshimd) -> None:
    request = daemon.api.ContainerStatsFilter(id=args.id or "", pod_sandbox_id=args.pod or "",
                                              label_selector=_labels(args.label))
    now, before = _sampled(args, lambda: list(daemon.call("ListContainerStats", filter=request).stats))
    rows = [{"container": _short(s.attributes.id), "name": s.attributes.metadata.name,
             "cpu_%": _cpu_percent(s.cpu, before[s.attributes.id].cpu if s.attributes.id in before else None),
             "memory": _size(_figure(s.memory, "working_set_bytes")), "usage": _size(_figure(s.memory, "usage_bytes"))}
            for s in now]
    emit(args, [_plain(s) for s in now], lambda out: _print_table(
        rows, ["container", "name", "cpu_%", "memory", "usage"], out))


def _statsp(args: argparse.Namespace, daemon: _Podshimd) -> None:
    request = daemon.api.PodSandboxStatsFilter(id=args.id or "", label_selector=_labels(args.label))
    now, before = _sampled(args, lambda: list(daemon.call("ListPodSandboxStats", filter=request).stats))
    rows = [{"pod_id": _short(s.attributes.id), "name": s.attributes.metadata.name,
             "cpu_%": _cpu_percent(s.linux.cpu, before[s.attributes.id].linux.cpu if s.attributes.id in before
                                   else None),
             "memory": _size(_figure(s.linux.memory, "working_set_bytes")),
             "processes": _figure(s.linux.process, "process_count"), "containers": len(s.linux.containers)}
            for s in now]
    emit(args, [_plain(s) for s in now], lambda out: _print_table(
        rows, ["pod_id", "name", "cpu_%", "memory", "processes", "containers"], out))


def _stats_arguments(p: argparse.ArgumentParser, pods: bool) -> None:
    p.add_argument("--id", default=None, help=f"only {'pods' if pods else 'containers'} whose id starts with this")
    if not pods:
        p.add_argument("--pod", "-p", default=None, help="only containers of this pod (id prefix)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="label selector")
    p.add_argument("--seconds", "-s", type=float, default=1.0, metavar="S",
                   help="seconds between the two samples CPU use is measured over (default 1; 0: no CPU figure)")


_verb("stats", "show running containers' CPU and memory use (from their cgroups)", _stats,
      lambda p: _stats_arguments(p, pods=False))
_verb("statsp", "show ready pods' CPU, memory and process counts (from their cgroups)", _statsp,
      lambda p: _stats_arguments(p, pods=True))


# -- images ----------------------------------------------------------------------------------------
def _auth_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--creds", default=None, metavar="USERNAME[:PASSWORD]", help="credentials for the registry")
    p.add_argument("--auth", default=None, metavar="AUTH_STRING",
                   help="base64 of USERNAME[:PASSWORD] for the registry")
    p.add_argument("--username", "-u", default=None, metavar="USERNAME",
                   help="user for the registry; the password is --password, else asked for")
    p.add_argument("--password", default=None, metavar="PASSWORD", help="password of --username")
    return p


def _auth(args: argparse.Namespace) -> dict[str, str] | None:
    """The AuthConfig fields the flags give (crictl's getAuth), or None for an anonymous pull."""
    if args.password is not None and args.username is None:
        raise CliError("--password needs --username")
    if sum(x is not None for x in (args.creds, args.auth, args.username)) > 1:
        raise CliError("give one of --creds, --auth and --username")
    if args.username is not None:
        if not args.username:
            raise CliError("--username can't be empty")
        password = args.password
        if password is None:
            import getpass

            try:
                password = getpass.getpass("Enter Password:")
            except EOFError:
                raise CliError("--username: no password given (use --password or type it)") from None
        return {"username": args.username, "password": password}
    if args.creds is not None:
        username, _, password = args.creds.partition(":")
        if not username:
            raise CliError("--creds must be USERNAME[:PASSWORD] with a username")
        return {"username": username, "password": password}
    if args.auth is not None:
        if not args.auth:
            raise CliError("--auth can't be empty")
        return {"auth": args.auth}
    return None


def _pull_image(daemon: _Podshimd, name: str, auth: dict[str, str] | None, sandbox: Any = None) -> str:
    reply = daemon.call("PullImage", image=daemon.api.ImageSpec(image=name),
                        auth=daemon.api.AuthConfig(**auth) if auth else None, sandbox_config=sandbox)
    return str(reply.image_ref)


def _pull(args: argparse.Namespace, daemon: _Podshimd) -> None:
    from . import archives

    auth = _auth(args)
    pulled = archives.pull(args, daemon, args.image, auth, _size)  # with progress
    if pulled is None:  # an older podshimd: CRI's PullImage
        before = daemon.call("ImageStatus", image=daemon.api.ImageSpec(image=args.image)).image.id  # "" when absent
        ref = _pull_image(daemon, args.image, auth)
        pulled = {"image_ref": ref, "up_to_date": ref == before}
    ref, fresh = pulled["image_ref"], pulled["up_to_date"]
    emit(args, pulled, lambda out: print(
        f"Image is up to date for {ref}" if fresh else f"Pulled {args.image}: {ref}", file=out))


_verb("pull", "pull an image from a registry", _pull,
      lambda p: (p.add_argument("image", metavar="NAME[:TAG|@DIGEST]"), _auth_arguments(p)))


def _image_rows(image: dict[str, Any]) -> list[dict[str, Any]]:
    """crictl's IMAGE TAG IMAGE ID SIZE rows of an image: one per tag."""
    digests = image.get("repo_digests") or []
    name = digests[0].split("@", 1)[0] if digests else "<none>"
    image_id = image["id"].removeprefix("sha256:")[:13]
    size = _size(int(image.get("size") or 0))
    tags = [t.rpartition(":") for t in image.get("repo_tags") or []] or [(name, ":", "<none>")]
    return [{"image": repo, "tag": tag, "image_id": image_id, "size": size} for repo, _, tag in tags]


def _images(args: argparse.Namespace, daemon: _Podshimd) -> None:
    found = daemon.call("ListImages", filter=daemon.api.ImageFilter(
        image=daemon.api.ImageSpec(image=args.image or ""))).images
    if args.quiet:
        for i in found:
            print(i.id)
        return
    images = sorted((_plain(i) for i in found), key=lambda i: (i.get("repo_tags") or [""])[0])
    _listing(args, "images", images, lambda out: _print_table(
        [row for i in images for row in _image_rows(i)], ["image", "tag", "image_id", "size"], out))


def _images_verb(args: argparse.Namespace, daemon: _Podshimd) -> None:
    """``images [IMAGE]`` lists; ``images import FILE...`` and ``images export IMAGE... -o FILE``
    go to :mod:`client.cli.archives`."""
    from . import archives

    if args.image == "import":
        return archives.import_archives(args, daemon, args.more)
    if args.image == "export":
        return archives.export_archive(args, daemon, args.more)
    if args.more:
        raise CliError(f"images: one IMAGE at most (got {args.image!r} and {', '.join(map(repr, args.more))}); "
                       "did you mean `images import` or `images export`?")
    if args.output is not None and args.output not in OUTPUTS:
        import difflib

        close = difflib.get_close_matches(args.output, OUTPUTS, 1)
        raise CliError(f"images: -o {args.output!r} is not one of {', '.join(OUTPUTS)}"
                       + (f"; did you mean {close[0]!r}?" if close else ""))
    return _images(args, daemon)


_verb("images", "list images; `images import FILE...` imports OCI archives and docker-archives, `images export "
                "IMAGE... -o FILE` writes an archive (podshimd reads and writes FILE)", _images_verb,
      lambda p: (p.add_argument("image", metavar="REPOSITORY[:TAG] | import | export", nargs="?", default=None,
                                help="only this image; or import, or export"),
                 p.add_argument("more", metavar="FILE | IMAGE", nargs="*",
                                help="import: the archives; export: the images"),
                 p.add_argument("--quiet", "-q", action="store_true", help="print ids only"),
                 p.add_argument("--output", "-o", default=None, metavar="FORMAT | FILE",
                                help="table (the default), or crictl's JSON or YAML document of the list; "
                                     "export: the archive to write"),
                 p.add_argument("--format", choices=("oci-archive", "docker-archive"), default="oci-archive",
                                help="export: the archive's format (default oci-archive)")))


def _image_status(daemon: _Podshimd, name: str, verbose: bool = False) -> Any:
    """ImageStatus's reply for the image ``name`` (name or id); NotFound when there is none."""
    reply = daemon.call("ImageStatus", image=daemon.api.ImageSpec(image=name), verbose=verbose)
    if not reply.HasField("image"):
        raise NotFound(f"no such image {name!r} present")
    return reply


def _inspecti(args: argparse.Namespace, daemon: _Podshimd) -> None:
    statuses = []
    for name in args.images:
        reply = _image_status(daemon, name, verbose=True)
        statuses.append(_with_info({"status": _plain(reply.image)}, reply.info))
    for status in statuses:  # JSON whatever --json says: crictl's default output
        print(json.dumps(status, indent=2, sort_keys=True))


_verb("inspecti", "show images' status with their config, as JSON", _inspecti,
      lambda p: p.add_argument("images", metavar="IMAGE", nargs="+", help="image name or id"))


def _rmi(args: argparse.Namespace, daemon: _Podshimd) -> None:
    for name in args.images:
        image_id = _image_status(daemon, name).image.id
        daemon.call("RemoveImage", image=daemon.api.ImageSpec(image=image_id))
        if not args.json:
            print(f"Deleted: {name}")


_verb("rmi", "remove images", _rmi,
      lambda p: p.add_argument("images", metavar="IMAGE", nargs="+", help="image name or id"))


def _imagefsinfo(args: argparse.Namespace, daemon: _Podshimd) -> None:
    reply = daemon.call("ImageFsInfo")
    filesystems = [_plain(f) for f in reply.image_filesystems]
    print(json.dumps({"status": filesystems[0] if len(filesystems) == 1 else filesystems}, indent=2, sort_keys=True))


_verb("imagefsinfo", "show the usage of the filesystem images are kept on, as JSON", _imagefsinfo, lambda p: None)



# -- the runtime: version, info; a container's resources ---------------------------------------------------
def _version(args: argparse.Namespace, daemon: _Podshimd) -> None:
    import shim

    reply = _plain(daemon.call("Version"))
    doc = {"client_version": shim.__version__, **reply}
    emit(args, doc, lambda out: print(
        f"Version:  {reply['version']}\nRuntimeName:  {reply['runtime_name']}\n"
        f"RuntimeVersion:  {reply['runtime_version']}\nRuntimeApiVersion:  {reply['runtime_api_version']}\n"
        f"ClientVersion:  podshimctl {shim.__version__}", file=out))


_verb("version", "show podshimd's runtime name and version (and podshimctl's)", _version, lambda p: None)


def _info(args: argparse.Namespace, daemon: _Podshimd) -> None:
    reply = daemon.call("Status", verbose=True)
    doc: dict[str, Any] = {"status": _plain(reply.status)}
    for key, value in reply.info.items():  # podshimd's effective configuration, as crictl info shows it
        try:
            doc[key] = json.loads(value)
        except ValueError:
            doc[key] = value
    doc["runtime_handlers"] = [_plain(h) for h in reply.runtime_handlers]
    doc["features"] = _plain(reply.features)
    _document(args, doc)


_verb("info", "show podshimd's status and effective configuration, as JSON", _info, lambda p: None)

#: update's flags -> LinuxContainerResources' fields.
_RESOURCE_FLAGS = {"cpu_period": "cpu_period", "cpu_quota": "cpu_quota", "cpu_share": "cpu_shares",
                   "cpuset_cpus": "cpuset_cpus", "cpuset_mems": "cpuset_mems", "memory": "memory_limit_in_bytes"}
_SIZE = re.compile(r"(\d+)([kmgt]i?b?|b)?", re.I)


def _bytes(text: str) -> int:
    """A memory size: bytes, or with a unit (k, m, g, t: powers of 1024; Ki, Mi, Gi as Kubernetes)."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or with k/m/g/t or Ki/Mi/Gi/Ti)")
    unit = (m.group(2) or "b")[0].lower()
    return int(m.group(1)) << 10 * "bkmgt".index(unit)


def _update(args: argparse.Namespace, daemon: _Podshimd) -> None:
    given = {field: getattr(args, flag) for flag, field in _RESOURCE_FLAGS.items() if getattr(args, flag) is not None}
    if not given:
        raise CliError("update: give at least one of --cpu-period, --cpu-quota, --cpu-share, --cpuset-cpus, "
                       "--cpuset-mems, --memory")
    resources = daemon.api.LinuxContainerResources(**given)  # a field not given (0) stays as it is
    for one_id in args.ids:
        daemon.call("UpdateContainerResources", container_id=one_id, linux=resources)
        if not args.json:
            print(one_id)


_verb("update", "change running containers' CPU and memory limits (UpdateContainerResources)", _update,
      lambda p: (_ids(p, "container"),
                 p.add_argument("--cpu-period", type=int, default=None, metavar="US", help="CFS period (µs)"),
                 p.add_argument("--cpu-quota", type=int, default=None, metavar="US", help="CFS quota (µs) per period"),
                 p.add_argument("--cpu-share", type=int, default=None, metavar="N", help="CPU shares (weight)"),
                 p.add_argument("--cpuset-cpus", default=None, metavar="LIST", help="CPUs to run on (0-3,5)"),
                 p.add_argument("--cpuset-mems", default=None, metavar="LIST", help="memory nodes (0,1)"),
                 p.add_argument("--memory", type=_bytes, default=None, metavar="SIZE",
                                help="memory limit: bytes, or 64m, 1g, 512Mi")))
