"""Running a CNI plugin chain (CNI spec 1.0.0) for a pod's network namespace.

:class:`CniConfig` is the network configuration list found in a conf dir; :class:`CniRunner`
execs the plugins with ADD, DEL and CHECK, as libcni does, and :func:`primary_ip` picks the
pod's IPs from the result as containerd does.

Each plugin invocation gets a clean environment (``PATH`` and the ``CNI_*`` variables only),
its network configuration on stdin (the plugin's own map with the list's ``name`` and
``cniVersion`` injected and ``prevResult`` chained), and at most ``timeout`` seconds; a plugin
that overruns is killed with its whole process group and the call fails with DeadlineExceeded.

**Where plugins run: ``plugin_netns``.** Plugins such as bridge act on the network namespace
they *run* in (the "host" side): they create the bridge there, set ``ip_forward`` there and add
iptables rules there. A runner made with ``plugin_netns=PATH`` runs every plugin under
``nsenter --net=PATH``, so all of that lands in that namespace and never in the namespace of
the caller. This is the isolation mechanism the tests use: they make a throw-away "outer"
netns, and the node's own interfaces, routes and firewall are never touched. Without it the
plugins run in the caller's network namespace, which is what a real node wants.

**Loopback.** A runner made with ``loopback=True`` (the default, as libcni's users do) brings the
pod's ``lo`` up itself: the loopback plugin runs beside the chain at ADD, DEL and CHECK. The pod
layer makes its runner with ``loopback=False``: its pods' network namespaces are made by their
shims with ``lo`` already up (:func:`shim.kernel.netns.create_netns`), so the plugin would only
cost a process per pod and operation.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from shim.api.identifiers import validate_identifier
from shim.cri.configs import load_json_object
from shim.lib.files import decode_json
from shim.rpc.status import FailedPrecondition, Internal, InvalidArgument, NotFound, RpcError, Unavailable

from client.cri.concurrency import together
from client.phases import phase
from client.processes import KILL_WAIT
from client.processes import run as _run

__all__ = [
    "DEFAULT_CONF_DIR",
    "DEFAULT_BIN_DIRS",
    "PLUGIN_TIMEOUT",
    "KILL_WAIT",
    "PLUGIN_PATH",
    "LOOPBACK_IFNAME",
    "POD_IFNAME",
    "CniConfig",
    "CniInterface",
    "CniIp",
    "CniRoute",
    "CniResult",
    "CniRunner",
    "primary_ip",
]

log = logging.getLogger(__name__)

#: Where network configuration lists are looked for (containerd's default).
DEFAULT_CONF_DIR = "/etc/cni/net.d"
#: Where plugin binaries are looked for, in order: Debian's package puts them in /usr/lib/cni,
#: upstream tarballs in /opt/cni/bin.
DEFAULT_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
#: How long one plugin invocation may take before it is killed.
PLUGIN_TIMEOUT = 30.0
#: The only PATH a plugin sees (bridge runs iptables, for example).
PLUGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOOPBACK_IFNAME = "lo"
#: The name of a pod's interface CNI ADD makes (libcni's and containerd's default).
POD_IFNAME = "eth0"
#: libcni names the loopback network this way.
_LOOPBACK_NETWORK = "cni-loopback"
_CONF_EXTENSIONS = (".conflist", ".conf", ".json")
_PLUGIN_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_IFNAME_MAX = 15  # IFNAMSIZ - 1
_OUTPUT_CHARS = 2000

# CNI error codes (spec, "Error"): 3 = container unknown, 11 = try again later; anything else
# (including the plugins' own 999) is a failure of the plugin or the node.
_CNI_CODE_ERRORS: dict[int, type[RpcError]] = {3: NotFound, 11: Unavailable}


def _version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        raise InvalidArgument(f"cniVersion {version!r} is not a version like 1.0.0") from None


@dataclass(frozen=True)
class CniConfig:
    """A network configuration list: its name, cniVersion and plugins, and the file it came from."""

    name: str
    cni_version: str
    plugins: tuple[dict[str, Any], ...]
    disable_check: bool = False
    source: str = ""

    @classmethod
    def from_json(cls, doc: Any, source: str = "network config") -> CniConfig:
        """Parse a ``.conflist`` document, or a single-plugin ``.conf`` one (which is wrapped into
        a list of one). Raises InvalidArgument naming ``source`` and the bad field."""
        if not isinstance(doc, dict):
            raise InvalidArgument(f"{source}: must be a JSON object")
        name, version = doc.get("name"), doc.get("cniVersion")
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"{source}: name must be a non-empty string")
        if not isinstance(version, str):
            raise InvalidArgument(f"{source}: cniVersion must be a string")
        try:
            _version_tuple(version)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{source}: {exc.message}") from None
        plugins = doc.get("plugins") if "plugins" in doc else [doc]
        if not isinstance(plugins, list) or not plugins:
            raise InvalidArgument(f"{source}: plugins must be a non-empty array")
        for i, plugin in enumerate(plugins):
            kind = plugin.get("type") if isinstance(plugin, dict) else None
            # type is a file name in the bin dirs: no '/' can send us elsewhere.
            if not isinstance(kind, str) or not _PLUGIN_TYPE.fullmatch(kind):
                raise InvalidArgument(f"{source}: plugins[{i}].type must be a plugin name (letters, digits, '.', '_', '-')")
        disable_check = doc.get("disableCheck", False)
        if not isinstance(disable_check, bool):
            raise InvalidArgument(f"{source}: disableCheck must be a boolean")
        return cls(name=name, cni_version=version, plugins=tuple(dict(p) for p in plugins),
                   disable_check=disable_check, source=source)

    @classmethod
    def load(cls, conf_dir: str = DEFAULT_CONF_DIR) -> CniConfig | None:
        """The network of the first file by name in ``conf_dir`` ending in .conflist, .conf or .json.

        Returns None when there is none (or no such directory): pods then get loopback only.
        Raises InvalidArgument naming the file when it is not a valid network configuration.
        """
        try:
            entries = sorted(os.listdir(conf_dir))
        except (FileNotFoundError, NotADirectoryError):
            return None
        for entry in entries:
            path = os.path.join(conf_dir, entry)
            if entry.endswith(_CONF_EXTENSIONS) and not entry.startswith(".") and os.path.isfile(path):
                return cls.from_json(load_json_object(path), source=path)
        return None

    def plugin_input(self, index: int, prev_result: dict[str, Any] | None,
                     runtime_config: Mapping[str, Any] | None = None) -> bytes:
        """What plugin ``index`` reads on stdin: its map with name, cniVersion and prevResult, and
        ``runtimeConfig`` with the entries of ``runtime_config`` whose capability the plugin
        declares (``"capabilities": {"portMappings": true}``), as libcni's injectRuntimeConfig."""
        doc = dict(self.plugins[index])
        doc["name"] = self.name
        doc["cniVersion"] = self.cni_version
        doc.pop("prevResult", None)
        if prev_result is not None:
            doc["prevResult"] = prev_result
        capabilities = doc.get("capabilities")
        if isinstance(capabilities, dict) and runtime_config:
            wanted = {k: v for k, v in runtime_config.items() if capabilities.get(k) is True}
            if wanted:
                doc["runtimeConfig"] = {**(doc.get("runtimeConfig") or {}), **wanted}
        return json.dumps(doc).encode()


_LOOPBACK = CniConfig(name=_LOOPBACK_NETWORK, cni_version="1.0.0", plugins=({"type": "loopback"},),
                      source="built-in loopback network")


@dataclass(frozen=True)
class CniInterface:
    """An interface of a result; ``sandbox`` is the netns path when it is inside the pod."""

    name: str
    mac: str = ""
    sandbox: str = ""


@dataclass(frozen=True)
class CniIp:
    """An address of a result, in CIDR form; ``interface`` indexes ``CniResult.interfaces``."""

    address: str
    gateway: str = ""
    interface: int | None = None

    @property
    def ip(self) -> str:
        """The address without its prefix length."""
        return self.address.split("/", 1)[0]

    @property
    def version(self) -> int:
        return ipaddress.ip_interface(self.address).version


@dataclass(frozen=True)
class CniRoute:
    dst: str
    gw: str = ""


@dataclass(frozen=True)
class CniResult:
    """The result of the chain's ADD (the last plugin's); ``raw`` is the JSON as the plugin
    printed it, which DEL and CHECK need back as prevResult. Empty when there was no network."""

    ips: tuple[CniIp, ...] = ()
    interfaces: tuple[CniInterface, ...] = ()
    routes: tuple[CniRoute, ...] = ()
    raw: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> CniResult:
        """Parse a spec 0.3.0-1.0.0 result; InvalidArgument if it is not shaped like one."""
        if raw is None:
            return cls()
        try:
            interfaces = tuple(CniInterface(name=i["name"], mac=i.get("mac", ""), sandbox=i.get("sandbox", ""))
                               for i in raw.get("interfaces") or ())
            ips = tuple(CniIp(address=i["address"], gateway=i.get("gateway", ""), interface=i.get("interface"))
                        for i in raw.get("ips") or ())
            for ip in ips:
                ipaddress.ip_interface(ip.address)
            routes = tuple(CniRoute(dst=r["dst"], gw=r.get("gw", "")) for r in raw.get("routes") or ())
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise InvalidArgument(f"not a CNI result: {type(exc).__name__}: {exc}") from None
        return cls(ips=ips, interfaces=interfaces, routes=routes, raw=raw)


def primary_ip(result: CniResult, ifname: str = POD_IFNAME) -> tuple[str, tuple[str, ...]]:
    """The pod's IP and additional IPs, as containerd picks them (selectPodIPs).

    The candidates are the addresses of the interface named ``ifname`` (all addresses when none
    names it); the primary is the first IPv4 among them, else the first; the others follow in
    order. Addresses come without prefix length; ``("", ())`` when there are none.
    """
    def on_ifname(ip: CniIp) -> bool:
        index = ip.interface
        return index is not None and 0 <= index < len(result.interfaces) and result.interfaces[index].name == ifname

    candidates = [ip for ip in result.ips if on_ifname(ip)] or list(result.ips)
    if not candidates:
        return "", ()
    primary = next((ip for ip in candidates if ip.version == 4), candidates[0])
    return primary.ip, tuple(ip.ip for ip in candidates if ip is not primary)


async def addresses_in_place(netns_path: str, result: CniResult | dict[str, Any] | None,
                             ifname: str = POD_IFNAME) -> bool:
    """Whether the pod's interface ``ifname`` in the network namespace ``netns_path`` holds every
    address ADD's ``result`` gave it: the pod's network is as ADD left it, whatever a plugin's CHECK
    says (Debian's portmap 1.1.1 cannot CHECK a pod with an IPv6 address). False when there is
    no result, no such interface, or ``ip`` cannot tell."""
    result = result if isinstance(result, CniResult) else CniResult.from_json(result)
    on_ifname = [ip.ip for ip in result.ips if ip.interface is None or (
        0 <= ip.interface < len(result.interfaces) and result.interfaces[ip.interface].name == ifname)]
    nsenter = shutil.which("nsenter", path=PLUGIN_PATH)
    if not on_ifname or nsenter is None:
        return False
    try:
        status, out, _ = await _run([nsenter, f"--net={netns_path}", "ip", "-j", "addr", "show", "dev", ifname],
                                    {"PATH": PLUGIN_PATH}, b"", PLUGIN_TIMEOUT, "ip addr show")
        links = decode_json(out, "ip -j addr show") if status == 0 else []
        held = {ipaddress.ip_address(a["local"]) for link in links for a in link.get("addr_info", ())}
    except (RpcError, ValueError, TypeError, KeyError, AttributeError):
        return False
    return all(ipaddress.ip_address(ip) in held for ip in on_ifname)


def _check_call(container_id: str, ifname: str, netns_path: str | None) -> None:
    """InvalidArgument unless the id, interface name and (when given) netns path are usable."""
    validate_identifier("container id", container_id)
    if not isinstance(ifname, str) or not ifname or len(ifname) > _IFNAME_MAX or any(
            c in ifname for c in "/: \t\n\0") or ifname in (".", ".."):
        raise InvalidArgument(f"interface name {ifname!r} is not valid (1-{_IFNAME_MAX} characters, no '/', ':' or space)")
    if netns_path is not None and (not isinstance(netns_path, str) or not os.path.isabs(netns_path)):
        raise InvalidArgument(f"netns path {netns_path!r} must be an absolute path")


def _cni_args(args: Mapping[str, str] | None) -> str:
    if not args:
        return ""
    for key, value in args.items():
        if not key or any(c in key for c in ";=\0") or any(c in value for c in ";\0"):
            raise InvalidArgument(f"CNI_ARGS entry {key!r}: the key must not be empty or contain ';' or '=', "
                                  "the value must not contain ';'")
    # IgnoreUnknown: plugins reject keys they do not know unless told not to (libcni does this too).
    return ";".join(["IgnoreUnknown=1", *(f"{k}={v}" for k, v in args.items())])


def _is_netns(path: str) -> bool | None:
    """True if ``path`` is a namespace file, False if it is another file, None if it is gone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    # Every namespace file lives on the one nsfs device.
    return st.st_dev == os.stat("/proc/self/ns/net").st_dev


class CniRunner:
    """Runs the CNI plugins for pods; see the module docstring.

    ``conf_dir`` is read at every call, so a configuration dropped in later takes effect for
    the next pod (as containerd's conf syncer does). ``bin_dirs`` is searched in order and
    passed as CNI_PATH. ``timeout`` bounds each plugin invocation. ``plugin_netns`` is the path
    of the network namespace the plugins run in (default: the caller's own). ``loopback``: the
    runner brings ``lo`` up with the loopback plugin (False: the namespaces it is given have
    ``lo`` up already; see the module docstring).
    """

    def __init__(self, conf_dir: str = DEFAULT_CONF_DIR, bin_dirs: Sequence[str] = DEFAULT_BIN_DIRS, *,
                 timeout: float = PLUGIN_TIMEOUT, plugin_netns: str | None = None, loopback: bool = True):
        if not bin_dirs:
            raise ValueError("bin_dirs must not be empty")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.conf_dir = conf_dir
        self.bin_dirs = tuple(bin_dirs)
        self.timeout = timeout
        self.plugin_netns = plugin_netns
        self.loopback = loopback
        self._nsenter = None
        if plugin_netns is not None:
            self._nsenter = shutil.which("nsenter", path=PLUGIN_PATH)
            if self._nsenter is None:
                raise FailedPrecondition("plugin_netns needs nsenter (util-linux), which is not installed")

    def config(self) -> CniConfig | None:
        """The current network configuration (None: loopback only); InvalidArgument if it is bad."""
        return CniConfig.load(self.conf_dir)

    async def add(self, container_id: str, netns_path: str, ifname: str = POD_IFNAME, *,
                  args: Mapping[str, str] | None = None,
                  runtime_config: Mapping[str, Any] | None = None) -> CniResult:
        """Bring up ``lo`` in the pod's netns (when the runner does: ``loopback``) and ADD the
        network to it as ``ifname`` (the two at once).

        Returns the chain's result (empty when there is no configuration: loopback only). On any
        failure, including cancellation, DEL runs for every plugin that was started, in reverse,
        so nothing is left half set up; then the original error is raised: the error the plugin
        printed as Internal (NotFound for CNI code 3, Unavailable for 11) with ``details[0]`` =
        ``{plugin, command, code, msg, details}``; FailedPrecondition for a missing plugin;
        DeadlineExceeded when a plugin overran ``timeout``; InvalidArgument for bad arguments
        or configuration. ``runtime_config`` (e.g. ``portMappings``) goes to the plugins that
        declare its capabilities (:meth:`CniConfig.plugin_input`); give DEL the same.
        """
        _check_call(container_id, ifname, netns_path)
        config = self.config()
        started: list[tuple[CniConfig, int, str]] = []  # what DEL must undo, in the order it started
        prev: dict[str, Any] | None = None

        async def loopback() -> None:
            if not self.loopback:
                return
            started.append((_LOOPBACK, 0, LOOPBACK_IFNAME))
            await self._exec(_LOOPBACK, 0, "ADD", container_id, netns_path, LOOPBACK_IFNAME, None, args)

        async def chain() -> None:
            nonlocal prev
            assert config is not None
            for index in range(len(config.plugins)):
                started.append((config, index, ifname))
                prev = await self._exec(config, index, "ADD", container_id, netns_path, ifname, prev, args,
                                        runtime_config)
                if prev is None:
                    raise Internal(f"CNI plugin {config.plugins[index]['type']!r} ADD printed no result")

        try:
            if config is None:
                await loopback()
                return CniResult()
            # lo and the chain's interface are separate networks of the pod: loopback runs beside
            # the chain, which runs in order (each plugin gets the previous one's result).
            await together(loopback, chain)
            return CniResult.from_json(prev)
        except BaseException:
            # Shielded and bounded: the undo must run even when the caller was cancelled.
            with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_WAIT + self.timeout):
                for config_i, index, name in reversed(started):
                    try:
                        await self._exec(config_i, index, "DEL", container_id, netns_path, name,
                                         _prev_for(config_i, prev), args, runtime_config)
                    except (RpcError, OSError) as exc:
                        log.warning("undoing a failed CNI ADD for %s: %s", container_id, exc)
            raise

    async def delete(self, container_id: str, netns_path: str, ifname: str = POD_IFNAME,
                     prev_result: CniResult | dict[str, Any] | None = None, *,
                     args: Mapping[str, str] | None = None,
                     runtime_config: Mapping[str, Any] | None = None) -> None:
        """DEL the network (plugins in reverse order) and, beside it, loopback (when the runner
        brings ``lo`` up). Idempotent.

        A netns that is gone is fine: its path is passed anyway and the plugins treat it as
        already torn down (IPAM still frees the address). A path that is left but no longer a
        namespace (unmounted) is passed as empty, which the spec allows for DEL. Every plugin
        is called even if one fails; then the first error is raised (the chain's before loopback's).
        """
        _check_call(container_id, ifname, None)
        if _is_netns(netns_path) is False:
            log.debug("CNI DEL for %s: %s is no longer a network namespace; passing none", container_id, netns_path)
            netns_path = ""
        raw = prev_result.raw if isinstance(prev_result, CniResult) else prev_result
        config = self.config()
        chain = [] if config is None else [(config, i, ifname) for i in reversed(range(len(config.plugins)))]
        chain_errors: list[BaseException] = []
        loopback_errors: list[BaseException] = []

        async def run(steps: list[tuple[CniConfig, int, str]], failed: list[BaseException]) -> None:
            for config_i, index, name in steps:
                try:
                    await self._exec(config_i, index, "DEL", container_id, netns_path, name,
                                     _prev_for(config_i, raw), args, runtime_config)
                except (RpcError, OSError) as exc:
                    failed.append(exc)

        # Loopback runs beside the chain (separate networks); neither stops the other.
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, chain, chain_errors)
            if self.loopback:
                tg.start_soon(run, [(_LOOPBACK, 0, LOOPBACK_IFNAME)], loopback_errors)
        failures = chain_errors + loopback_errors
        for exc in failures[1:]:
            log.warning("CNI DEL for %s: %s", container_id, exc)
        if failures:
            raise failures[0]

    async def check(self, container_id: str, netns_path: str, ifname: str = POD_IFNAME,
                    prev_result: CniResult | dict[str, Any] | None = None, *,
                    args: Mapping[str, str] | None = None,
                    runtime_config: Mapping[str, Any] | None = None) -> None:
        """CHECK that the network is as ADD left it (loopback when the runner brings ``lo`` up,
        then each plugin in order).

        ``prev_result`` is the ADD result. Does nothing when there is no configuration or it
        says ``disableCheck``. Raises FailedPrecondition if the configuration's cniVersion is
        older than 0.4.0 (no CHECK then) or there is no ADD result; otherwise as :meth:`add`.
        """
        _check_call(container_id, ifname, netns_path)
        config = self.config()
        if self.loopback:
            await self._exec(_LOOPBACK, 0, "CHECK", container_id, netns_path, LOOPBACK_IFNAME, None, args)
        if config is None or config.disable_check:
            return
        if _version_tuple(config.cni_version) < (0, 4, 0):
            raise FailedPrecondition(f"{config.source}: cniVersion {config.cni_version} has no CHECK (0.4.0 and later)")
        raw = prev_result.raw if isinstance(prev_result, CniResult) else prev_result
        if raw is None:
            raise FailedPrecondition(f"CNI CHECK for {container_id} needs the ADD result")
        for index in range(len(config.plugins)):
            await self._exec(config, index, "CHECK", container_id, netns_path, ifname, raw, args, runtime_config)

    def _find_plugin(self, kind: str) -> str:
        for directory in self.bin_dirs:
            path = os.path.join(directory, kind)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        raise FailedPrecondition(f"CNI plugin {kind!r} not found in {', '.join(self.bin_dirs)}")

    async def _exec(self, config: CniConfig, index: int, command: str, container_id: str, netns_path: str,
                    ifname: str, prev_result: dict[str, Any] | None,
                    args: Mapping[str, str] | None,
                    runtime_config: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """Run one plugin once; its stdout as JSON, or None if it printed nothing.

        A plugin that exits non-zero raises the error it printed (``{code, msg, details}``) as
        Internal (NotFound for code 3, Unavailable for 11); ``details[0]`` is a map with
        ``plugin``, ``command``, ``code``, ``msg`` and ``details``. One that prints no such error
        raises Internal with what it wrote on stderr.
        """
        kind = config.plugins[index]["type"]
        binary = self._find_plugin(kind)
        argv = [binary] if self._nsenter is None else [self._nsenter, f"--net={self.plugin_netns}", "--", binary]
        env = {
            "PATH": PLUGIN_PATH,
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id,
            "CNI_NETNS": netns_path,
            "CNI_IFNAME": ifname,
            "CNI_PATH": os.pathsep.join(self.bin_dirs),
        }
        cni_args = _cni_args(args)
        if cni_args:
            env["CNI_ARGS"] = cni_args
        what = f"CNI plugin {kind!r} {command} for {container_id}"
        with phase(f"{kind} {command}"):
            returncode, stdout, stderr = await _run(argv, env, config.plugin_input(index, prev_result, runtime_config),
                                                  self.timeout, what)
        out = stdout.decode(errors="replace").strip()
        if returncode != 0:
            raise _plugin_error(kind, command, returncode, out, stderr.decode(errors="replace").strip())
        if not out:
            return None
        try:
            doc = decode_json(out, "its output")
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            if command == "ADD":
                CniResult.from_json(doc)
        except (ValueError, InvalidArgument) as exc:
            raise Internal(f"{what} printed something that is not a CNI result ({exc}): {out[:_OUTPUT_CHARS]}") from None
        return doc


def _prev_for(config: CniConfig, raw: dict[str, Any] | None) -> dict[str, Any] | None:
    # Loopback is its own network: the main network's result is not its prevResult. Before
    # 0.4.0 DEL got no prevResult (libcni does the same).
    if config is _LOOPBACK or _version_tuple(config.cni_version) < (0, 4, 0):
        return None
    return raw


def _plugin_error(kind: str, command: str, returncode: int, out: str, err: str) -> RpcError:
    try:
        doc = decode_json(out, "its output")
        code, msg = doc["code"], doc.get("msg", "")
        if not isinstance(code, int) or not isinstance(msg, str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        said = (err or out)[-_OUTPUT_CHARS:] or "nothing"
        return Internal(f"CNI plugin {kind!r} {command} failed with exit status {returncode}: {said}",
                        details=[{"plugin": kind, "command": command, "code": None, "msg": said, "details": ""}])
    details = doc.get("details", "")
    cls = _CNI_CODE_ERRORS.get(code, Internal)
    return cls(f"CNI plugin {kind!r} {command} failed with code {code}: {msg}" + (f" ({details})" if details else ""),
               details=[{"plugin": kind, "command": command, "code": code, "msg": msg, "details": details}])
