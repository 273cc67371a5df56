"""podshimd's configuration: ``/etc/podshim/config.toml``, its defaults, its validation, its flags.

Every key, its type and its default is a field of :class:`Config`; the file holds any subset of them
at top level (TOML, UTF-8), except ``registries``, a table per registry host::

    state_root = "/var/lib/podshim"
    listen = "unix:///run/podshim/podshimd.sock"
    cni_bin_dirs = ["/usr/lib/cni", "/opt/cni/bin"]
    cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]  # CDI specs (JSON), later directories override
    runtime_handlers = ["native", "runc"]
    cgroup_driver = "cgroupfs"          # or "systemd" (pure cgroup v2); RuntimeConfig answers it
    template = true
    image_pull_timeout = 3600           # seconds a whole PullImage may take
    image_pull_progress_timeout = 300   # seconds it may go without a byte downloaded
    image_pull_max_unpacked_bytes = 68719476736  # bytes one PullImage may unpack (64 GiB)
    max_parallel_pod_starts = 4         # RunPodSandbox calls carried out at once; 0 = no limit

    [registries."docker.io"]            # per registry host (host or host:port)
    mirrors = ["mirror.example:5000"]   # tried first, in order
    [registries."mirror.example:5000"]
    insecure = true                     # plain HTTP (a mirror's own entry says so for it)

No file at the default path means the defaults; a path given with ``--config`` must exist. Flags
override the file. Anything wrong is refused with a :class:`ConfigError` that names the file (or the
command line), the key (or flag) and the reason in one sentence: podshimd never starts on a config
it half understood.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shim.api.cgroups import CGROUPFS, check_parent
from shim.api.cgroups import DRIVERS as CGROUP_DRIVERS
from shim.api.defaults import CATATONIT
from shim.api.handlers import NATIVE, RUNTIME_HANDLERS
from shim.api.paths import SUN_PATH_MAX
from shim.rpc.status import RpcError

from client.controller.defaults import DEFAULT_RUNTIME_ROOT, podshimd_endpoint
from client.cri.cdi import DEFAULT_SPEC_DIRS as DEFAULT_CDI_SPEC_DIRS
from client.cri.cni import DEFAULT_BIN_DIRS as DEFAULT_CNI_BIN_DIRS
from client.cri.cni import DEFAULT_CONF_DIR as DEFAULT_CNI_CONF_DIR
from client.images.pull import PULL_PROGRESS_TIMEOUT, PULL_TIMEOUT
from client.images.reference import ReferenceError, parse
from client.images.service import MAX_UNPACKED_BYTES
from client.images.skopeo import RegistryHost

__all__ = ["DEFAULT_CONFIG_PATH", "DEFAULT_PARALLEL_POD_STARTS", "DEFAULT_STATE_ROOT", "DEFAULT_LISTEN", "LOG_LEVELS", "CGROUPFS", "COMMAND_LINE", "Config",
           "ConfigError", "load", "add_arguments", "from_arguments", "reload_log_level"]

DEFAULT_CONFIG_PATH = "/etc/podshim/config.toml"
#: podshimd's state root: pods/, logs/, pod-files/, images/, and its Controller's bundle root
#: sandboxes/ (docs/roots.md); another layout than a Controller's bundle root.
DEFAULT_STATE_ROOT = "/var/lib/podshim"
#: ``listen`` when neither the file nor a flag sets it follows ``runtime_root`` (as podshimctl's
#: default endpoint does); this is it for the default runtime root.
DEFAULT_LISTEN = podshimd_endpoint(DEFAULT_RUNTIME_ROOT)
LOG_LEVELS = ("debug", "info", "warning", "error")
# The cgroup drivers (CGROUP_DRIVERS, shim.api.cgroups): cgroupfs, podshim makes and
# writes the cgroup directories itself; systemd, each pod's cgroup is a scope systemd makes in the
# slice kubelet names. RuntimeConfig answers the one in force; kubelet's cgroupDriver must match.
COMMAND_LINE = "command line"  # the "file" of a ConfigError about a flag

#: RunPodSandbox calls carried out at once (the rest wait their turn, in order): see
#: client.podshimd.handlers.Changes.
DEFAULT_PARALLEL_POD_STARTS = 4

_UNIX = "unix://"
# sun_path's bytes on Linux, less its terminating NUL.
_MAX_SOCKET_PATH_BYTES = SUN_PATH_MAX - 1


@dataclass(frozen=True)
class Config:
    """podshimd's settings: each field is a key of config.toml, with its default."""

    state_root: str = DEFAULT_STATE_ROOT  # pod records, logs, sandbox bundles
    runtime_root: str = DEFAULT_RUNTIME_ROOT  # shim sockets, the template, OCI runtime state
    listen: str = DEFAULT_LISTEN  # the CRI socket, unix:///ABSOLUTE/PATH (default RUNTIME_ROOT/podshimd.sock)
    cni_conf_dir: str = DEFAULT_CNI_CONF_DIR
    cni_bin_dirs: tuple[str, ...] = DEFAULT_CNI_BIN_DIRS
    cdi_spec_dirs: tuple[str, ...] = DEFAULT_CDI_SPEC_DIRS  # CDI spec files, lowest priority first
    default_runtime_handler: str = NATIVE  # for RunPodSandbox's empty runtime_handler
    runtime_handlers: tuple[str, ...] = RUNTIME_HANDLERS  # the handlers CRI clients may ask for
    cgroup_parent: str = ""  # "" = under podshimd's own cgroup; "/x" from each hierarchy's root
    cgroup_driver: str = CGROUPFS  # who makes the pods' cgroups: cgroupfs (directories podshim writes) or systemd
    sandbox_binary: str = CATATONIT  # the pause, run as `catatonit -P`
    sandbox_image: str = ""  # the pause as an image (containerd's sandbox_image); "" = the built-in pause
    template: bool = True  # spawn shims from the preloaded template
    log_level: str = "info"
    metrics_address: str = ""  # HOST:PORT; "" = no metrics endpoint
    streaming_address: str = "127.0.0.1:0"  # HOST:PORT of the exec/attach/port-forward server (0: any free port)
    image_pull_timeout: float = PULL_TIMEOUT  # seconds a whole PullImage may take
    image_pull_progress_timeout: float = PULL_PROGRESS_TIMEOUT  # seconds a PullImage may download nothing
    image_pull_max_unpacked_bytes: int = MAX_UNPACKED_BYTES  # uncompressed layer bytes one PullImage may unpack
    max_parallel_pod_starts: int = DEFAULT_PARALLEL_POD_STARTS  # RunPodSandbox calls carried out at once; 0 = no limit
    registries: tuple[RegistryHost, ...] = ()  # [registries."HOST"]: mirrors, insecure (plain HTTP)

    @property
    def socket_path(self) -> str:
        """The filesystem path of :attr:`listen`."""
        return _socket_path(self.listen)


class ConfigError(ValueError):
    """A configuration refused: ``source`` (a file path or ``"command line"``), ``key`` (a config key,
    a flag, or None for the file as a whole) and ``reason``; ``str()`` is one sentence of all three."""

    def __init__(self, source: str, key: str | None, reason: str) -> None:
        self.source = source
        self.key = key
        self.reason = reason
        where = source if key is None else f"{source}: {key}"
        super().__init__(f"{where}: {reason}")


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_ABSOLUTE_PATHS = ("state_root", "runtime_root", "cni_conf_dir", "sandbox_binary")
# The flags that set a key, for the messages about them; every other key is set in the file only.
_FLAGS = {"listen": "--listen", "state_root": "--state-root", "runtime_root": "--runtime-root",
          "cni_conf_dir": "--cni-conf-dir", "cni_bin_dirs": "--cni-bin-dir", "log_level": "--log-level",
          "sandbox_image": "--sandbox-image"}


def _socket_path(listen: str) -> str:
    """The path of a ``unix:///PATH`` listen URL (assumed valid)."""
    return listen[len(_UNIX):]


def load(path: str | None = None, overrides: Mapping[str, Any] | None = None, *,
         default_path: str = DEFAULT_CONFIG_PATH) -> Config:
    """Read the config file and apply ``overrides`` (config key -> value, from flags) on top of it.

    ``path`` None reads ``default_path`` if it exists, else starts from the defaults; an explicit
    ``path`` must exist. Raises :class:`ConfigError` for anything wrong in the file or the overrides.
    """
    source = default_path if path is None else path
    values: dict[str, Any] = {}
    try:
        with open(source, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if path is not None:
            raise ConfigError(source, None, "the config file does not exist") from None
    except OSError as exc:
        raise ConfigError(source, None, f"the config file cannot be read: {exc.strerror}") from None
    else:
        values.update(_parse(source, data))
    for key, value in (overrides or {}).items():
        if key not in _FIELDS:
            raise ValueError(f"override of an unknown config key {key!r}")  # a bug in the caller
        values[key] = _check(COMMAND_LINE, _FLAGS.get(key, key), key, value)
    if "listen" not in values and "runtime_root" in values:
        # The socket follows the runtime root, as podshimctl expects it to.
        where, name = (COMMAND_LINE, _FLAGS["runtime_root"]) if "runtime_root" in (overrides or {}) else \
            (source, "runtime_root")
        values["listen"] = _check(where, name, "listen", podshimd_endpoint(values["runtime_root"]))
    config = Config(**values)
    _check_together(config, source, values, overrides or {})
    return config


def _parse(source: str, data: bytes) -> dict[str, Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(source, None, f"the file is not UTF-8 (byte 0x{data[exc.start]:02x} on line {line})") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message ends "(at line L, column C)" (Python 3.11 has no lineno attribute).
        raise ConfigError(source, None, f"bad TOML syntax: {exc}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError(source, None, "bad TOML syntax: it is nested too deeply") from None
    values = {}
    for key, value in table.items():
        if key not in _FIELDS:
            close = difflib.get_close_matches(key, _FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known keys: {', '.join(_FIELDS)})"
            raise ConfigError(source, key, f"unknown key{hint}")
        values[key] = _check(source, key, key, value)
    return values


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def _check(source: str, name: str, key: str, value: Any) -> Any:
    """``value`` for ``key`` checked on its own and normalized (arrays become tuples); ``name`` is how
    the message calls the key (the key itself, or the flag that set it)."""
    def refuse(reason: str) -> ConfigError:
        return ConfigError(source, name, reason)

    kind = _FIELDS[key].type
    if key == "registries":
        return _check_registries(refuse, value)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise refuse(f"must be a number of seconds greater than 0, not {value!r}")
        return float(value)
    if key == "max_parallel_pod_starts":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise refuse(f"must be a whole number of pod starts, 0 for no limit, not {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise refuse(f"must be a number of bytes greater than 0, not {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise refuse(f"must be a boolean (true or false), not {_type_name(value)}")
        return value
    if kind == "tuple[str, ...]":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise refuse(f"must be an array of strings, not {_type_name(value)}")
        value = tuple(value)
        if not value:
            raise refuse("must not be empty")
        duplicates = sorted({v for v in value if value.count(v) > 1})
        if duplicates:
            raise refuse(f"lists {duplicates[0]!r} twice")
    elif not isinstance(value, str):
        raise refuse(f"must be a string, not {_type_name(value)}")

    if key in _ABSOLUTE_PATHS:
        _check_absolute(refuse, value)
    elif key in ("cni_bin_dirs", "cdi_spec_dirs"):
        for directory in value:
            _check_absolute(refuse, directory)
    elif key == "listen":
        _check_listen(refuse, value)
    elif key == "runtime_handlers":
        for handler in value:
            _check_handler(refuse, handler)
    elif key == "default_runtime_handler":
        _check_handler(refuse, value)
    elif key == "cgroup_parent":
        if "\x00" in value or ".." in value.split("/"):
            raise refuse(f"must be a cgroup path without '..', not {value!r}")
    elif key == "cgroup_driver":
        if value not in CGROUP_DRIVERS:
            raise refuse(f"must be one of {', '.join(map(repr, CGROUP_DRIVERS))}, not {value!r}")
    elif key == "log_level":
        if value not in LOG_LEVELS:
            raise refuse(f"must be one of {', '.join(LOG_LEVELS)}, not {value!r}")
    elif key == "metrics_address":
        if value:
            _check_address(refuse, value)
    elif key == "streaming_address":
        _check_address(refuse, value)
    elif key == "sandbox_image":
        if value:
            try:
                parse(value)
            except ReferenceError as exc:
                raise refuse(f"{value!r} is not an image reference: {exc}") from None
    return value


_REGISTRY_KEYS = ("mirrors", "insecure")
#: What a check raises: the ConfigError naming the key being checked, for a reason.
Refuse = Callable[[str], ConfigError]


def _check_registry_host(refuse: Refuse, what: str, host: Any) -> str:
    if not isinstance(host, str):
        raise refuse(f"{what} must be a string, not {_type_name(host)}")
    try:
        ref = parse(f"{host}/x")
    except ReferenceError:
        ref = None
    if ref is None or ref.domain != host or "/" in host:
        raise refuse(f"{what} {host!r} is not a registry host (HOST or HOST:PORT, such as docker.io or "
                     "127.0.0.1:5000)")
    return host


def _check_registries(refuse: Refuse, value: Any) -> tuple[RegistryHost, ...]:
    if not isinstance(value, dict):
        raise refuse(f"must be a table of registry hosts ([registries.\"HOST\"]), not {_type_name(value)}")
    hosts = []
    for host, settings in sorted(value.items()):
        _check_registry_host(refuse, "the key", host)
        if not isinstance(settings, dict):
            raise refuse(f"{host!r} must be a table (mirrors, insecure), not {_type_name(settings)}")
        unknown = sorted(set(settings) - set(_REGISTRY_KEYS))
        if unknown:
            raise refuse(f"{host!r} has the unknown key {unknown[0]!r} (known: {', '.join(_REGISTRY_KEYS)})")
        mirrors = settings.get("mirrors", [])
        if not isinstance(mirrors, list):
            raise refuse(f"{host!r}: mirrors must be an array of registry hosts, not {_type_name(mirrors)}")
        for mirror in mirrors:
            _check_registry_host(refuse, f"{host!r}: the mirror", mirror)
        insecure = settings.get("insecure", False)
        if not isinstance(insecure, bool):
            raise refuse(f"{host!r}: insecure must be a boolean (true or false), not {_type_name(insecure)}")
        hosts.append(RegistryHost(host, tuple(mirrors), insecure))
    return tuple(hosts)


def _check_absolute(refuse: Refuse, path: str) -> None:
    if not path.startswith("/") or "\x00" in path:
        raise refuse(f"must be an absolute path, not {path!r}")


def _check_handler(refuse: Refuse, handler: str) -> None:
    if handler not in RUNTIME_HANDLERS:
        raise refuse(f"runtime handler {handler!r} is not known (known: {', '.join(RUNTIME_HANDLERS)})")


def _check_listen(refuse: Refuse, listen: str) -> None:
    if not listen.startswith(_UNIX):
        raise refuse(f"must be a unix:///ABSOLUTE/PATH URL, not {listen!r}")
    path = _socket_path(listen)
    if not path.startswith("/") or path.endswith("/") or "\x00" in path:
        raise refuse(f"must be a unix:///ABSOLUTE/PATH URL with the socket's absolute path, not {listen!r}")
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH_BYTES:
        raise refuse(f"socket path {path!r} is longer than a Unix socket allows ({_MAX_SOCKET_PATH_BYTES} bytes)")


def _check_address(refuse: Refuse, address: str) -> None:
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise refuse(f"must be HOST:PORT with a port from 0 to 65535, not {address!r}")


def _check_together(config: Config, source: str, from_file: Mapping[str, Any], overrides: Mapping[str, Any]) -> None:
    """Rules between keys, reported against the key that set the later of the two."""
    if config.default_runtime_handler not in config.runtime_handlers:
        key = "default_runtime_handler" if "default_runtime_handler" in from_file else "runtime_handlers"
        raise ConfigError(source, key, f"the default runtime handler {config.default_runtime_handler!r} is not "
                                       f"among runtime_handlers ({', '.join(config.runtime_handlers)})")
    if config.sandbox_image and ("sandbox_binary" in from_file or "sandbox_binary" in overrides):
        where, key = (COMMAND_LINE, _FLAGS["sandbox_image"]) if "sandbox_image" in overrides else \
            (source, "sandbox_image")
        raise ConfigError(where, key, "sandbox_binary and sandbox_image are both set: the pause is either a "
                                      "binary or an image; set one of them")
    if config.cgroup_parent:
        try:
            check_parent(config.cgroup_parent, config.cgroup_driver)
        except RpcError as exc:
            key = "cgroup_parent" if "cgroup_parent" in from_file else "cgroup_driver"
            raise ConfigError(source, key, exc.message) from None


# -- flags -------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and the flags that override config keys to ``parser``."""
    parser.add_argument("--config", metavar="FILE",
                        help=f"the config file (default {DEFAULT_CONFIG_PATH}, if it exists)")
    parser.add_argument("--listen", metavar="unix:///PATH",
                        help=f"the CRI socket (default unix://RUNTIME_ROOT/podshimd.sock: {DEFAULT_LISTEN})")
    parser.add_argument("--state-root", metavar="DIR", help=f"default {DEFAULT_STATE_ROOT}")
    parser.add_argument("--runtime-root", metavar="DIR", help=f"default {DEFAULT_RUNTIME_ROOT}")
    parser.add_argument("--cni-conf-dir", metavar="DIR", help=f"default {DEFAULT_CNI_CONF_DIR}")
    parser.add_argument("--cni-bin-dir", metavar="DIRS",
                        help=f"plugin directories, colon- or comma-separated (default {':'.join(DEFAULT_CNI_BIN_DIRS)})")
    parser.add_argument("--log-level", metavar="LEVEL", help=f"{', '.join(LOG_LEVELS)} (default info)")
    parser.add_argument("--sandbox-image", metavar="IMAGE",
                        help="the pause as an image, pulled when missing (default: none, the built-in static pause)")


def from_arguments(args: argparse.Namespace, *, default_path: str = DEFAULT_CONFIG_PATH) -> Config:
    """The config file named by ``args.config`` (or ``default_path`` if it exists) with the flags in
    ``args`` on top. Raises :class:`ConfigError`."""
    overrides: dict[str, Any] = {}
    for key, flag in _FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is None:
            continue
        if key == "cni_bin_dirs":
            value = value.replace(",", ":").split(":")
            if "" in value:
                raise ConfigError(COMMAND_LINE, flag, f"has an empty directory in {args.cni_bin_dir!r}")
        overrides[key] = value
    return load(args.config, overrides, default_path=default_path)


def reload_log_level(args: argparse.Namespace, running: Config, log: logging.Logger) -> Config:
    """SIGHUP: read the config file (and ``args``' flags) again and apply its log level to the root
    logger; return the config now in force (``running`` with the new level). Nothing else changes
    without a restart: a changed key is named in a warning; a config that does not load keeps the
    level, with an error saying why."""
    try:
        fresh = from_arguments(args)
    except ConfigError as exc:
        log.error("SIGHUP: the log level stays %s: %s", running.log_level, exc)
        return running
    logging.getLogger().setLevel(fresh.log_level.upper())
    changed = sorted(name for name in _FIELDS if name != "log_level"
                     and getattr(fresh, name) != getattr(running, name))
    if changed:
        log.warning("SIGHUP applies the log level only: restart podshimd to apply %s", ", ".join(changed))
    if fresh.log_level != running.log_level:
        log.warning("log level is now %s (was %s)", fresh.log_level, running.log_level)
    return dataclasses.replace(running, log_level=fresh.log_level)
