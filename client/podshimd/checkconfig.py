"""``podshimd --check-config`` and ``podshimd --print-default-config``: the config checked before a start.

:func:`check` loads the config as podshimd would (:func:`.config.from_arguments`: the file, then the
flags; an unknown key gets "did you mean") and then looks at what its paths name on this node: the
roots can be made, the pause binary runs, the runtime handlers' binaries are installed, the
systemd cgroup driver has systemd and pure cgroup v2 under it, the CNI network config is valid and
its plugins are in ``cni_bin_dirs``. Each finding is a
:class:`Finding`, an ``error`` (podshimd would not start, or pods would fail) or a ``warning``
(podshimd starts, but something an operator probably wants is missing: pods get loopback only
without a CNI config). Nothing is made or changed.

:func:`default_config` is the defaults of the one schema (:class:`.config.Config`) as TOML that
:func:`.config.load` reads back to the same Config.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass

from shim.rpc.status import RpcError

from .config import DEFAULT_CONFIG_PATH, Config

__all__ = ["Finding", "cgroup_driver_unmet", "check", "default_config"]

_COMMENTED = {"listen": "follows runtime_root", "sandbox_image": "refused beside sandbox_binary"}
#: There when systemd is the init (sd_booted()); the unified hierarchy's mark at the cgroup root.
_SYSTEMD_BOOTED = "/run/systemd/system"
_CGROUP2_ROOT = "/sys/fs/cgroup/cgroup.controllers"
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Finding:
    """One thing wrong: ``level`` is ``error`` or ``warning``; ``key`` the config key it is about."""

    level: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.key}: {self.message}"


def check(config: Config) -> list[Finding]:
    """What is wrong on this node with the paths ``config`` names (see the module's docstring)."""
    found: list[Finding] = []
    for key in ("state_root", "runtime_root"):
        reason = _unmakeable(getattr(config, key))
        if reason:
            found.append(Finding("error", key, reason))
    reason = _unmakeable(os.path.dirname(config.socket_path))
    if reason:
        found.append(Finding("error", "listen", reason))
    if not config.sandbox_image and not _executable(config.sandbox_binary):
        found.append(Finding("error", "sandbox_binary", f"{config.sandbox_binary} is not an executable file "
                                                        "(install catatonit, or set sandbox_image)"))
    path = os.pathsep.join(filter(None, (os.environ.get("PATH"), _SEARCH_PATH)))
    for handler in config.runtime_handlers:
        if handler != "native" and shutil.which(handler, path=path) is None:
            found.append(Finding("error", "runtime_handlers", f"runtime handler {handler!r} needs the {handler} "
                                                              f"binary, which is not in {path} (install {handler}, "
                                                              f"or remove it from runtime_handlers)"))
    found += [Finding("error", "cgroup_driver", reason) for reason in cgroup_driver_unmet(config.cgroup_driver)]
    bin_dirs = [d for d in config.cni_bin_dirs if os.path.isdir(d)]
    if not bin_dirs:
        found.append(Finding("error", "cni_bin_dirs", f"none of {', '.join(config.cni_bin_dirs)} is a directory "
                                                      "(install containernetworking-plugins)"))
    found += _check_cni(config, bin_dirs)
    return found


def cgroup_driver_unmet(driver: str) -> list[str]:
    """What this machine lacks that the cgroup ``driver`` needs (a sentence each; none for
    cgroupfs): podshimd refuses to start on any of them, and ``--check-config`` reports them."""
    if driver != "systemd":
        return []
    unmet = []
    if not os.path.isdir(_SYSTEMD_BOOTED):
        unmet.append("the systemd cgroup driver needs systemd as the init of this machine, which it is not "
                     "(no /run/systemd/system): use cgroupfs")
    if not os.path.exists(_CGROUP2_ROOT):
        unmet.append("the systemd cgroup driver needs a pure cgroup v2 machine (/sys/fs/cgroup is not the "
                     "unified hierarchy): use cgroupfs")
    return unmet


def _check_cni(config: Config, bin_dirs: list[str]) -> list[Finding]:
    from client.cri.cni import CniConfig

    try:
        network = CniConfig.load(config.cni_conf_dir)
    except RpcError as exc:
        return [Finding("error", "cni_conf_dir", f"the CNI network config is not valid: {exc.message}")]
    except OSError as exc:
        return [Finding("error", "cni_conf_dir", f"{config.cni_conf_dir} cannot be read: {exc.strerror}")]
    if network is None:
        return [Finding("warning", "cni_conf_dir", f"no CNI network config (*.conflist, *.conf, *.json) in "
                                                   f"{config.cni_conf_dir}: pods get loopback only and the node "
                                                   "stays NotReady (examples/cni has one)")]
    found = []
    for plugin in network.plugins:
        if bin_dirs and not any(_executable(os.path.join(d, plugin["type"])) for d in bin_dirs):
            found.append(Finding("error", "cni_bin_dirs", f"{network.source} uses the plugin {plugin['type']!r}, "
                                                          f"which is in none of {', '.join(bin_dirs)}"))
    return found


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _unmakeable(path: str) -> str | None:
    """Why podshimd could not have the directory ``path`` (None when it is there or can be made):
    the nearest existing ancestor must be a directory."""
    probe = path
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{path} cannot be a directory: {probe} is not one"
    if probe != path and not os.access(probe, os.W_OK | os.X_OK):
        return f"{path} cannot be made: {probe} is not writable"
    return None


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(int(value)) if float(value).is_integer() else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def default_config() -> str:
    """The schema's defaults as a config file (TOML) that loads back to ``Config()``."""
    lines = [f"# podshimd's defaults ({DEFAULT_CONFIG_PATH}): `podshimd --print-default-config`.",
             "# Every key is in docs/configuration.md; check a changed file with `podshimd --check-config`.", ""]
    for field in dataclasses.fields(Config):
        if field.name == "registries":
            continue
        line = f"{field.name} = {_toml_value(getattr(Config(), field.name))}"
        # Left unset, listen follows runtime_root; sandbox_image set beside sandbox_binary is refused.
        lines.append(f"# {line}" if field.name in _COMMENTED else line)
    lines += ["", "# One table per registry host (none by default), for example a plain-HTTP registry:",
              '# [registries."registry.local:5000"]', "# insecure = true",
              '# mirrors = ["mirror.local:5000"]', ""]
    return "\n".join(lines)
