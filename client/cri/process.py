"""A container's process from its CRI config and its image's config, as kubelet and containerd's
CRI plugin specify (containerd ``WithProcessArgs``, ``containerSpec``); pure functions.

- **argv**: ``command`` replaces the image's Entrypoint *and* drops its Cmd; ``args`` alone
  replaces the Cmd and keeps the Entrypoint; neither: Entrypoint + Cmd. An image Entrypoint of
  exactly ``[""]`` means none (docker's way to clear an inherited one). Nothing to run is
  INVALID_ARGUMENT.
- **env**: ``PATH`` (the default, when nothing else sets it) and ``HOSTNAME`` (the pod's), then
  the image's Env, then the CRI ``envs``; a later value of a name replaces an earlier one in its
  place.
- **working directory**: the CRI ``working_dir``, else the image's WorkingDir, else ``/``.
- **user**: the image's User, used only when the CRI security context names no user (the
  caller resolves it in the image's files).

``image`` is the ``config`` object of an OCI image config (``Entrypoint``, ``Cmd``, ``Env``,
``WorkingDir``, ``User``), or None for a container without an image.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shim.cri.configs import ContainerConfig
from shim.rpc.status import InvalidArgument

__all__ = ["DEFAULT_PATH", "Process", "container_process", "merge_env"]

#: containerd's defaultUnixEnv PATH, for a container whose image and config set none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Process:
    """What a container runs: ``args`` with ``env`` (``NAME=VALUE``) in ``cwd``; ``image_user``
    is the image's User ("" when it names none)."""

    args: tuple[str, ...]
    env: tuple[str, ...]
    cwd: str
    image_user: str = ""


def merge_env(*layers: Iterable[str]) -> tuple[str, ...]:
    """``NAME=VALUE`` entries of every layer in order; a name set again takes the later value in
    the place it first had (containerd's replaceOrAppendEnvValues)."""
    merged: dict[str, str] = {}
    for layer in layers:
        for entry in layer:
            name, _, _value = entry.partition("=")
            merged[name] = entry
    return tuple(merged.values())


def _str_list(image: Mapping[str, Any], key: str) -> list[str]:
    value = image.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"the image's config.{key} is not an array of strings")
    return value


def _string(image: Mapping[str, Any], key: str) -> str:
    value = image.get(key) or ""
    if not isinstance(value, str):
        raise InvalidArgument(f"the image's config.{key} is not a string")
    return value


def container_process(cfg: ContainerConfig, image: Mapping[str, Any] | None, *, hostname: str) -> Process:
    """The process of a container made from ``cfg`` on an image whose config is ``image`` (None:
    no image), in a pod whose hostname is ``hostname``. Raises InvalidArgument when there is
    nothing to run or the image's config is malformed."""
    image = image or {}
    command, args = list(cfg.command), list(cfg.args)
    if not command:
        if not args:
            args = _str_list(image, "Cmd")
        entrypoint = _str_list(image, "Entrypoint")
        command = [] if entrypoint == [""] else entrypoint
    argv = tuple(command + args)
    if not argv:
        where = f"image {cfg.image!r} has no Entrypoint or Cmd" if cfg.image else "there is no image"
        raise InvalidArgument(f"no command specified: command and args are empty and {where}")
    env = merge_env([f"PATH={DEFAULT_PATH}", f"HOSTNAME={hostname}"], _str_list(image, "Env"),
                    (f"{k}={v}" for k, v in cfg.envs))
    working_dir = cfg.working_dir or _string(image, "WorkingDir") or "/"
    if not os.path.isabs(working_dir):
        raise InvalidArgument(f"the image's config.WorkingDir {working_dir!r} is not an absolute path")
    return Process(args=argv, env=env, cwd=working_dir, image_user=_string(image, "User"))
