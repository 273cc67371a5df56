"""CDI (the Container Device Interface): a container's ``CDI_devices``, named ``vendor.com/class=name``,
resolved with the node's CDI spec files into what the container gets: device nodes, mounts,
environment variables and supplementary groups.

A spec file is a JSON document (``*.json``) in one of the spec directories (config
``cdi_spec_dirs``; by default /etc/cdi, then /var/run/cdi): ``cdiVersion``, ``kind``
(``vendor.com/class``), ``devices`` (each a ``name`` and its ``containerEdits``) and the spec's own
``containerEdits``, applied with any of its devices. A device found in several directories is the
last directory's (a spec of /var/run/cdi overrides one of /etc/cdi); twice in one directory is an
error. What podshim cannot apply is refused with a sentence, never skipped:

- a YAML spec file (``*.yaml``, ``*.yml``): podshim has no YAML parser, so a spec directory holding
  one is refused whenever a container asks for a CDI device (write the spec as JSON);
- ``hooks`` (podshim runs no OCI hooks) and ``intelRdt``;
- a mount whose type is not ``bind``.

A device name that no spec defines is INVALID_ARGUMENT naming it; a spec file that is not valid is
FAILED_PRECONDITION naming the file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shim.rpc.status import FailedPrecondition, InvalidArgument

__all__ = ["DEFAULT_SPEC_DIRS", "CdiEdits", "merge_env", "parse_name", "resolve"]

#: Where CDI spec files are, lowest priority first (the CDI specification's defaults).
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
# vendor: a domain-like name; class: alphanumerics with - and _; name: alphanumerics with - _ . :
_NAME = re.compile(r"^(?P<kind>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?)"
                   r"=(?P<name>[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?)$")
_YAML = (".yaml", ".yml")
_EDIT_KEYS = frozenset({"env", "deviceNodes", "mounts", "hooks", "intelRdt", "additionalGids"})


@dataclass
class CdiEdits:
    """What a container's CDI devices add to it: ``env`` (``KEY=value``), ``devices`` (Task.Create
    ``devices`` entries: container_path, host_path, permissions), ``mounts`` (Task.Create binds) and
    ``additional_gids``."""

    env: list[str] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    additional_gids: list[int] = field(default_factory=list)


def parse_name(name: str) -> tuple[str, str]:
    """A fully qualified CDI device name as (kind, device); InvalidArgument when it is not one."""
    match = _NAME.match(name)
    if match is None:
        raise InvalidArgument(f"CDI device {name!r} is not a fully qualified CDI device name "
                              "(vendor.com/class=name)")
    return match["kind"], match["name"]


def resolve(names: Iterable[str], spec_dirs: Iterable[str] = DEFAULT_SPEC_DIRS) -> CdiEdits:
    """The edits of the CDI devices ``names`` from the spec files in ``spec_dirs`` (read now: device
    plugins write them while the node runs). InvalidArgument for a name that is not fully qualified
    or that no spec defines; FailedPrecondition for a spec that cannot be read or applied."""
    wanted = [(name, *parse_name(name)) for name in names]
    edits = CdiEdits()
    if not wanted:
        return edits
    found = _devices(spec_dirs)
    applied_specs: set[str] = set()
    for name, kind, device in wanted:
        entry = found.get((kind, device))
        if entry is None:
            raise InvalidArgument(f"CDI device {name!r} is not defined by any CDI spec in "
                                  f"{', '.join(spec_dirs)}")
        path, spec, device_edits = entry
        if path not in applied_specs:  # a spec's own edits once, whichever of its devices asks
            applied_specs.add(path)
            _apply(edits, spec.get("containerEdits"), f"{path}: containerEdits")
        _apply(edits, device_edits, f"{path}: device {device!r}")
    return edits


def _devices(spec_dirs: Iterable[str]) -> dict[tuple[str, str], tuple[str, Mapping[str, Any], Any]]:
    """(kind, device) -> (spec path, spec, the device's containerEdits), the later directory winning."""
    found: dict[tuple[str, str], tuple[str, Mapping[str, Any], Any]] = {}
    for directory in spec_dirs:
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise FailedPrecondition(f"cannot list the CDI spec directory {directory}: {exc.strerror}") from None
        here: dict[tuple[str, str], str] = {}
        for file_name in names:
            path = os.path.join(directory, file_name)
            if file_name.endswith(_YAML):
                raise FailedPrecondition(f"CDI spec {path} is YAML, which podshim cannot read (it has no YAML "
                                         "parser): write the spec as JSON (.json)")
            if not file_name.endswith(".json"):
                continue
            spec = _read_spec(path)
            kind = spec["kind"]
            for device in spec["devices"]:
                key = (kind, device["name"])
                if key in here:
                    raise FailedPrecondition(f"CDI device {kind}={device['name']} is defined twice in {directory} "
                                             f"({here[key]} and {path})")
                here[key] = path
                found[key] = (path, spec, device.get("containerEdits"))
    return found


def _read_spec(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            spec = json.loads(f.read())
    except OSError as exc:
        raise FailedPrecondition(f"cannot read CDI spec {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise FailedPrecondition(f"CDI spec {path} is not valid JSON: {exc}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str) or "=" in spec["kind"]:
        raise FailedPrecondition(f"CDI spec {path} has no valid kind (vendor.com/class)")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not all(isinstance(d, dict) and isinstance(d.get("name"), str)
                                                for d in devices):
        raise FailedPrecondition(f"CDI spec {path}: devices must be a list of objects with a name")
    for device in devices:
        parse_name(f"{spec['kind']}={device['name']}")
    return spec


def _apply(edits: CdiEdits, doc: Any, where: str) -> None:
    """Add one containerEdits object to ``edits``; FailedPrecondition for what cannot be applied."""
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise FailedPrecondition(f"CDI spec {where} must be an object")
    unknown = sorted(set(doc) - _EDIT_KEYS)
    if unknown:
        raise FailedPrecondition(f"CDI spec {where} has {unknown[0]!r}, which podshim does not know")
    if doc.get("hooks"):
        raise FailedPrecondition(f"CDI spec {where} has hooks, which podshim cannot apply (it runs no OCI hooks)")
    if doc.get("intelRdt"):
        raise FailedPrecondition(f"CDI spec {where} has intelRdt, which podshim cannot apply")
    for i, entry in enumerate(doc.get("env") or []):
        if not isinstance(entry, str) or "=" not in entry:
            raise FailedPrecondition(f"CDI spec {where}: env[{i}] must be KEY=value")
        edits.env.append(entry)
    for i, node in enumerate(doc.get("deviceNodes") or []):
        if not isinstance(node, dict) or not isinstance(node.get("path"), str):
            raise FailedPrecondition(f"CDI spec {where}: deviceNodes[{i}] needs a path")
        host_path = node.get("hostPath") or node["path"]
        edits.devices.append({"container_path": node["path"], "host_path": host_path,
                              "permissions": node.get("permissions") or "rwm"})
    for i, mount in enumerate(doc.get("mounts") or []):
        if not isinstance(mount, dict) or not isinstance(mount.get("hostPath"), str) \
                or not isinstance(mount.get("containerPath"), str):
            raise FailedPrecondition(f"CDI spec {where}: mounts[{i}] needs hostPath and containerPath")
        options = list(mount.get("options") or [])
        if mount.get("type", "bind") != "bind" and "bind" not in options and "rbind" not in options:
            raise FailedPrecondition(f"CDI spec {where}: mounts[{i}] is of type {mount.get('type')!r}; podshim "
                                     "applies bind mounts only")
        edits.mounts.append({"destination": mount["containerPath"], "source": mount["hostPath"], "type": "bind",
                             "options": options or ["rbind"]})
    for i, gid in enumerate(doc.get("additionalGids") or []):
        if not isinstance(gid, int) or isinstance(gid, bool) or gid < 0:
            raise FailedPrecondition(f"CDI spec {where}: additionalGids[{i}] must be a group id")
        edits.additional_gids.append(gid)


def merge_env(env: Iterable[str], added: Iterable[str]) -> list[str]:
    """``env`` (``KEY=value``) with ``added`` applied: a key already there takes the added value in
    its place, a new key goes at the end."""
    out = list(env)
    where = {entry.partition("=")[0]: i for i, entry in enumerate(out)}
    for entry in added:
        key = entry.partition("=")[0]
        if key in where:
            out[where[key]] = entry
        else:
            where[key] = len(out)
            out.append(entry)
    return out
