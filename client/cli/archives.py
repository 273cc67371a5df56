"""podshimctl's image archives and pull progress, through podshimd's ``podshim.images.v1.Images``
service (:mod:`client.podshimd.archives`): podshimd imports and exports, so the image store keeps
one writer.

    podshimctl images import FILE...                                  # OCI archives or docker-archives
    podshimctl images export IMAGE... -o FILE [--format oci-archive|docker-archive]
    podshimctl pull IMAGE                                             # progress on a terminal

A pull shows its progress (layers and bytes) on stderr when stderr is a terminal, and, with
``--json``, as one JSON line per change on stdout (``{"event": "progress", ...}``) before its result.
A podshimd without the service (an older one) pulls through CRI's PullImage, without progress.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from shim.rpc.status import Code, Unimplemented, error_from_status

from .main import CliError, emit

__all__ = ["SERVICE", "call", "import_archives", "export_archive", "pull"]

SERVICE = "podshim.images.v1.Images"
#: Seconds between two looks at a pull's progress.
PROGRESS_INTERVAL = 0.25
#: Deadline of one progress call.
PROGRESS_TIMEOUT = 10.0


def call(daemon: Any, method: str, request: dict[str, Any], deadline: float | None) -> dict[str, Any]:
    """``method`` of podshimd's images service with the JSON ``request``; its JSON reply. Raises
    RpcError (Unimplemented from a podshimd without the service)."""
    outcome = daemon.channel_call(f"/{SERVICE}/{method}", json.dumps(request).encode(), deadline)
    if outcome.code != Code.OK:
        raise error_from_status(outcome.code, outcome.details)
    try:
        reply = json.loads(outcome.message)
    except ValueError:
        raise CliError(f"podshimd's {method} reply is not JSON") from None
    if not isinstance(reply, dict):
        raise CliError(f"podshimd's {method} reply is not a JSON object")
    return reply


def _absolute(path: str) -> str:
    return os.path.abspath(path)


def import_archives(args: argparse.Namespace, daemon: Any, files: list[str]) -> None:
    if not files:
        raise CliError("images import: name at least one archive FILE")
    imported = []
    for name in files:
        path = _absolute(name)
        if not os.path.isfile(path):
            raise CliError(f"images import: {name} is not a file")
        reply = call(daemon, "Import", {"path": path}, None)  # the daemon bounds it (unpack limits)
        imported += reply["images"]
        if not args.json:
            for image in reply["images"]:
                print(f"Imported {', '.join(image['repo_tags']) or 'an untagged image'}: {image['id']}")
    if args.json:
        emit(args, {"images": imported})


def export_archive(args: argparse.Namespace, daemon: Any, names: list[str]) -> None:
    if not names:
        raise CliError("images export: name at least one IMAGE")
    if not args.output:
        raise CliError("images export: -o FILE names the archive to write")
    path = _absolute(args.output)
    if not os.path.isdir(os.path.dirname(path)):
        raise CliError(f"images export: {os.path.dirname(path)} is not a directory")
    reply = call(daemon, "Export", {"images": names, "path": path, "format": args.format}, None)
    emit(args, reply, lambda out: print(f"Exported {len(reply['images'])} image(s) to {path} ({reply['bytes']} bytes, "
                                        f"{args.format})", file=out))


def pull(args: argparse.Namespace, daemon: Any, name: str, auth: dict[str, str] | None,
         size: Any) -> dict[str, Any] | None:
    """Pull ``name`` through podshimd's Pull, showing its progress (see the module's docstring);
    ``{"image_ref", "up_to_date"}``, or None when podshimd has no such service (the caller pulls
    through CRI). ``size`` formats bytes for people."""
    terminal = not args.json and sys.stderr.isatty()
    request = {"image": name, **({"auth": auth} if auth else {})}
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["reply"] = call(daemon, "Pull", request, None)  # bounded by image_pull_timeout
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="pull", daemon=True)
    worker.start()
    watcher = type(daemon)(daemon.endpoint) if terminal or args.json else None
    shown, width = None, 0
    try:
        while worker.is_alive():
            worker.join(PROGRESS_INTERVAL)
            if watcher is None or not worker.is_alive():
                continue
            try:
                progress = call(watcher, "PullProgress", {"image": name}, PROGRESS_TIMEOUT)
            except Unimplemented:
                watcher.close()
                watcher = None
                continue
            if not progress.get("pulling") or progress == shown:
                continue
            shown = progress
            if args.json:
                print(json.dumps({"event": "progress", "image": name, **{k: progress[k] for k in (
                    "layers", "layers_done", "bytes", "bytes_done")}}), flush=True)
            else:
                line = (f"Pulling {name}: {progress['layers_done']}/{progress['layers'] or '?'} layers, "
                        f"{size(progress['bytes_done'])}/{size(progress['bytes']) if progress['bytes'] else '?'}")
                sys.stderr.write("\r" + line.ljust(width))
                sys.stderr.flush()
                width = len(line)
    finally:
        if watcher is not None:
            watcher.close()
        if width:
            sys.stderr.write("\r" + " " * width + "\r")
            sys.stderr.flush()
    if "error" in outcome:
        if isinstance(outcome["error"], Unimplemented):
            return None
        raise outcome["error"]
    reply = outcome["reply"]
    return {"image_ref": reply["image"]["id"], "up_to_date": bool(reply["up_to_date"])}
