"""podshimd's config file (/etc/podshim/config.toml) and flags: defaults, validation, precedence."""

from __future__ import annotations

import argparse
import dataclasses
import os

import pytest

from shim.api.defaults import CATATONIT
from shim.api.handlers import RUNTIME_HANDLERS
from shim.api.names import DEFAULT_RUNTIME_ROOT

from client.controller.defaults import DEFAULT_BUNDLE_ROOT
from client.cri.cni import DEFAULT_BIN_DIRS, DEFAULT_CONF_DIR
from client.podshimd import config
from client.podshimd.config import COMMAND_LINE, DEFAULT_STATE_ROOT, Config, ConfigError


@pytest.fixture
def missing(tmp_path) -> str:
    """A default config path that does not exist."""
    return str(tmp_path / "absent" / "config.toml")


@pytest.fixture
def write(tmp_path):
    """Write a config file (str: UTF-8 text, bytes: as is) and return its path."""
    def write(content: str | bytes) -> str:
        path = tmp_path / "config.toml"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)
    return write


def refused(path: str, **overrides) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config.load(path, overrides)
    return info.value


def parse_flags(argv: list[str], default_path: str) -> Config:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.from_arguments(parser.parse_args(argv), default_path=default_path)


# -- defaults --------------------------------------------------------------------------------------

def test_no_config_file_at_the_default_path_gives_the_defaults(missing) -> None:
    assert config.load(default_path=missing) == Config()


def test_defaults_are_the_ones_the_rest_of_podshim_uses() -> None:
    c = Config()
    assert (c.state_root, c.runtime_root) == (DEFAULT_STATE_ROOT, DEFAULT_RUNTIME_ROOT) == ("/var/lib/podshim",
                                                                                           "/run/podshim")
    assert c.listen == "unix:///run/podshim/podshimd.sock" and c.socket_path == "/run/podshim/podshimd.sock"
    # Two layouts, two defaults: the Controller's bundle root is podshimd's own, in its state root.
    assert DEFAULT_BUNDLE_ROOT == os.path.join(DEFAULT_STATE_ROOT, "sandboxes") != DEFAULT_STATE_ROOT
    assert c.cni_conf_dir == DEFAULT_CONF_DIR == "/etc/cni/net.d"
    assert c.cni_bin_dirs == DEFAULT_BIN_DIRS == ("/usr/lib/cni", "/opt/cni/bin")
    assert c.default_runtime_handler == "native" and c.runtime_handlers == RUNTIME_HANDLERS == ("native", "runc",
                                                                                                 "crun")
    assert c.cgroup_parent == "" and c.sandbox_binary == CATATONIT == "/usr/bin/catatonit"
    assert c.template is True and c.log_level == "info"
    assert c.metrics_address == "" and c.streaming_address == "127.0.0.1:0"


def test_an_empty_file_gives_the_defaults(write) -> None:
    assert config.load(write("")) == Config()


def test_the_default_path_is_read_when_it_exists(write) -> None:
    path = write('log_level = "debug"\n')
    assert config.load(default_path=path).log_level == "debug"


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().log_level = "debug"


# -- a good file -----------------------------------------------------------------------------------

def test_every_key_is_read_from_the_file(write) -> None:
    path = write("""
        state_root = "/srv/podshim/state"
        runtime_root = "/run/p"
        listen = "unix:///run/p/cri.sock"
        cni_conf_dir = "/srv/cni/conf"
        cni_bin_dirs = ["/srv/cni/bin"]
        default_runtime_handler = "runc"
        runtime_handlers = ["runc", "native"]
        cgroup_parent = "/podshim.slice"
        sandbox_binary = "/usr/local/bin/catatonit"
        template = false
        log_level = "warning"
        metrics_address = "127.0.0.1:9100"
        streaming_address = "[::1]:10010"
    """)
    assert config.load(path) == Config(
        state_root="/srv/podshim/state", runtime_root="/run/p", listen="unix:///run/p/cri.sock",
        cni_conf_dir="/srv/cni/conf", cni_bin_dirs=("/srv/cni/bin",), default_runtime_handler="runc",
        runtime_handlers=("runc", "native"), cgroup_parent="/podshim.slice",
        sandbox_binary="/usr/local/bin/catatonit", template=False, log_level="warning",
        metrics_address="127.0.0.1:9100", streaming_address="[::1]:10010")


def test_keys_not_in_the_file_keep_their_defaults(write) -> None:
    assert config.load(write('template = false\n')) == Config(template=False)


def test_a_relative_cgroup_parent_is_accepted(write) -> None:
    assert config.load(write('cgroup_parent = "podshim/k8s"\n')).cgroup_parent == "podshim/k8s"


# -- a bad file: one sentence naming the file, the key and the reason -------------------------------

def test_an_explicit_config_path_that_does_not_exist_is_refused(missing) -> None:
    error = refused(missing)
    assert (error.source, error.key) == (missing, None)
    assert str(error) == f"{missing}: the config file does not exist"


def test_a_directory_as_config_file_is_refused(tmp_path) -> None:
    error = refused(str(tmp_path))
    assert str(error) == f"{tmp_path}: the config file cannot be read: Is a directory"


def test_an_unknown_key_is_refused_with_the_closest_known_one(write) -> None:
    path = write('state_rot = "/var/lib/x"\n')
    error = refused(path)
    assert (error.source, error.key) == (path, "state_rot")
    assert str(error) == f"{path}: state_rot: unknown key (did you mean 'state_root'?)"


def test_an_unknown_key_without_a_close_one_lists_the_known_keys(write) -> None:
    error = refused(write('[plugins]\nx = 1\n'))
    assert error.key == "plugins" and "known keys: state_root, runtime_root, listen" in error.reason


def test_a_wrong_type_is_refused(write) -> None:
    path = write('template = "yes"\n')
    assert str(refused(path)) == f"{path}: template: must be a boolean (true or false), not a string"
    assert refused(write("state_root = 1\n")).reason == "must be a string, not a number"
    assert refused(write('cni_bin_dirs = "/usr/lib/cni"\n')).reason == "must be an array of strings, not a string"
    assert refused(write('cni_bin_dirs = ["/a", 2]\n')).reason == "must be an array of strings, not an array"
    assert refused(write("log_level = true\n")).reason == "must be a string, not a boolean"


def test_the_pulls_unpack_limit_is_a_positive_number_of_bytes(write) -> None:
    assert Config().image_pull_max_unpacked_bytes == 64 << 30
    assert config.load(write("image_pull_max_unpacked_bytes = 1048576\n")).image_pull_max_unpacked_bytes == 1 << 20
    for value in ("0", "-1", "1.5", '"1G"', "true"):
        assert refused(write(f"image_pull_max_unpacked_bytes = {value}\n")).reason.startswith(
            "must be a number of bytes greater than 0, not ")


def test_a_file_that_is_not_utf8_is_refused_with_its_line(write) -> None:
    path = write(b'log_level = "info"\nstate_root = "/var/\xfflib"\n')
    error = refused(path)
    assert (error.source, error.key) == (path, None)
    assert str(error) == f"{path}: the file is not UTF-8 (byte 0xff on line 2)"


def test_toml_nested_100000_deep_is_refused_in_one_sentence(write) -> None:
    path = write("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert str(refused(path)) == f"{path}: bad TOML syntax: it is nested too deeply"


def test_bad_toml_syntax_is_refused_with_its_line(write) -> None:
    path = write('log_level = "info"\n\nstate_root = /var/lib/podshim\n')
    error = refused(path)
    assert error.key is None
    assert str(error).startswith(f"{path}: bad TOML syntax: ") and "line 3" in str(error)


def test_a_key_given_twice_is_bad_toml(write) -> None:
    assert "bad TOML syntax" in str(refused(write('template = true\ntemplate = false\n')))


@pytest.mark.parametrize("key", ["state_root", "runtime_root", "cni_conf_dir", "sandbox_binary"])
def test_a_relative_path_is_refused_where_an_absolute_one_is_required(write, key) -> None:
    path = write(f'{key} = "var/lib/podshim"\n')
    assert str(refused(path)) == f"{path}: {key}: must be an absolute path, not 'var/lib/podshim'"


def test_a_relative_cni_bin_dir_is_refused(write) -> None:
    path = write('cni_bin_dirs = ["/usr/lib/cni", "opt/cni/bin"]\n')
    assert str(refused(path)) == f"{path}: cni_bin_dirs: must be an absolute path, not 'opt/cni/bin'"


def test_an_empty_or_repeating_list_is_refused(write) -> None:
    assert refused(write("cni_bin_dirs = []\n")).reason == "must not be empty"
    assert refused(write('runtime_handlers = []\n')).reason == "must not be empty"
    assert refused(write('runtime_handlers = ["runc", "native", "runc"]\n')).reason == "lists 'runc' twice"


@pytest.mark.parametrize("listen", ["/run/podshim/podshimd.sock", "tcp://127.0.0.1:1234", "unix://run/x.sock",
                                    "unix:///run/podshim/", "unix://", "unix:///" + "x" * 120])
def test_a_bad_listen_url_is_refused(write, listen) -> None:
    path = write(f'listen = "{listen}"\n')
    error = refused(path)
    assert error.key == "listen" and str(error).startswith(f"{path}: listen: ")
    assert "unix:///ABSOLUTE/PATH" in error.reason or "longer than a Unix socket allows" in error.reason


def test_an_unknown_runtime_handler_is_refused(write) -> None:
    path = write('runtime_handlers = ["native", "kata"]\n')
    assert str(refused(path)) == (f"{path}: runtime_handlers: runtime handler 'kata' is not known "
                                  "(known: native, runc, crun)")
    assert refused(write('default_runtime_handler = "gvisor"\n')).key == "default_runtime_handler"


def test_a_default_runtime_handler_outside_the_handlers_list_is_refused(write) -> None:
    path = write('default_runtime_handler = "crun"\nruntime_handlers = ["native", "runc"]\n')
    assert str(refused(path)) == (f"{path}: default_runtime_handler: the default runtime handler 'crun' is not "
                                  "among runtime_handlers (native, runc)")
    # Leaving the default "native" out of the list is the list's fault.
    assert refused(write('runtime_handlers = ["runc"]\n')).key == "runtime_handlers"


def test_a_bad_log_level_is_refused(write) -> None:
    path = write('log_level = "verbose"\n')
    assert str(refused(path)) == f"{path}: log_level: must be one of debug, info, warning, error, not 'verbose'"


@pytest.mark.parametrize("key,value", [("metrics_address", "9100"), ("metrics_address", "localhost:http"),
                                       ("streaming_address", ""), ("streaming_address", ":10010"),
                                       ("streaming_address", "127.0.0.1:70000")])
def test_a_bad_address_is_refused(write, key, value) -> None:
    assert refused(write(f'{key} = "{value}"\n')).reason == (f"must be HOST:PORT with a port from 0 to 65535, "
                                                              f"not {value!r}")


def test_a_cgroup_parent_climbing_out_is_refused(write) -> None:
    assert refused(write('cgroup_parent = "../escape"\n')).reason == "must be a cgroup path without '..', not '../escape'"


# -- flags -----------------------------------------------------------------------------------------

def test_flags_override_the_file(write, tmp_path) -> None:
    path = write('state_root = "/from/file"\nruntime_root = "/from/file/run"\nlog_level = "error"\n')
    c = parse_flags(["--config", path, "--state-root", "/from/flag", "--log-level", "debug",
                     "--listen", "unix:///tmp/p.sock", "--cni-conf-dir", "/c", "--cni-bin-dir", "/a:/b,/c"],
                    default_path=str(tmp_path / "absent"))
    assert (c.state_root, c.runtime_root, c.log_level) == ("/from/flag", "/from/file/run", "debug")
    assert (c.listen, c.cni_conf_dir, c.cni_bin_dirs) == ("unix:///tmp/p.sock", "/c", ("/a", "/b", "/c"))


def test_flags_alone_override_the_defaults(missing) -> None:
    assert parse_flags(["--runtime-root", "/run/x"], default_path=missing) == Config(
        runtime_root="/run/x", listen="unix:///run/x/podshimd.sock")


def test_the_socket_follows_the_runtime_root_unless_listen_is_given(write, missing) -> None:
    from client.controller.defaults import podshimd_endpoint

    assert parse_flags(["--runtime-root", "/run/x"], default_path=missing).socket_path == "/run/x/podshimd.sock"
    assert config.load(write('runtime_root = "/run/y"\n')).listen == "unix:///run/y/podshimd.sock"
    assert config.load(write('runtime_root = "/run/y"\nlisten = "unix:///tmp/p.sock"\n')).listen == "unix:///tmp/p.sock"
    assert parse_flags(["--runtime-root", "/run/x", "--listen", "unix:///tmp/q.sock"],
                       default_path=missing).listen == "unix:///tmp/q.sock"
    # podshimctl's pod verbs look there too (client/cli/pods.py), through the one default.
    assert podshimd_endpoint("/run/x") == parse_flags(["--runtime-root", "/run/x"], default_path=missing).listen
    too_long = "/" + "r" * 120
    with pytest.raises(ConfigError) as info:
        parse_flags(["--runtime-root", too_long], default_path=missing)
    assert info.value.key == "--runtime-root" and "longer than a Unix socket allows" in info.value.reason


def test_a_bad_flag_value_is_refused_naming_the_flag(missing) -> None:
    with pytest.raises(ConfigError) as info:
        parse_flags(["--state-root", "relative"], default_path=missing)
    assert str(info.value) == f"{COMMAND_LINE}: --state-root: must be an absolute path, not 'relative'"
    with pytest.raises(ConfigError) as info:
        parse_flags(["--cni-bin-dir", "/a::/b"], default_path=missing)
    assert str(info.value) == f"{COMMAND_LINE}: --cni-bin-dir: has an empty directory in '/a::/b'"
    with pytest.raises(ConfigError) as info:
        parse_flags(["--listen", "unix://x"], default_path=missing)
    assert info.value.key == "--listen"


def test_a_missing_config_flag_file_is_refused(missing) -> None:
    with pytest.raises(ConfigError, match="the config file does not exist"):
        parse_flags(["--config", missing], default_path=os.devnull)


# -- the sandbox image -----------------------------------------------------------------------------

def test_the_sandbox_image_is_empty_by_default_the_built_in_pause(missing) -> None:
    assert Config().sandbox_image == "" and config.load(default_path=missing).sandbox_image == ""


def test_the_sandbox_image_is_read_from_the_file_and_the_flag(write, tmp_path) -> None:
    path = write('sandbox_image = "registry.example:5000/pause:3.9"\n')
    assert config.load(path).sandbox_image == "registry.example:5000/pause:3.9"
    flagged = parse_flags(["--config", path, "--sandbox-image", "pause"], default_path=str(tmp_path / "absent"))
    assert flagged.sandbox_image == "pause"


def test_a_sandbox_image_that_is_not_a_reference_is_refused(write, missing) -> None:
    path = write('sandbox_image = "Pause:Latest:x"\n')
    error = refused(path)
    assert (error.source, error.key) == (path, "sandbox_image")
    assert error.reason.startswith("'Pause:Latest:x' is not an image reference: ")
    with pytest.raises(ConfigError) as info:
        parse_flags(["--sandbox-image", "UPPER/case"], default_path=missing)
    assert (info.value.source, info.value.key) == (COMMAND_LINE, "--sandbox-image")


def test_sandbox_binary_and_sandbox_image_together_are_refused(write, tmp_path) -> None:
    path = write('sandbox_binary = "/usr/bin/catatonit"\nsandbox_image = "pause:3.9"\n')
    assert str(refused(path)) == (f"{path}: sandbox_image: sandbox_binary and sandbox_image are both set: the pause "
                                  "is either a binary or an image; set one of them")
    path = write('sandbox_binary = "/usr/bin/catatonit"\n')
    with pytest.raises(ConfigError) as info:
        parse_flags(["--config", path, "--sandbox-image", "pause:3.9"], default_path=str(tmp_path / "absent"))
    assert (info.value.source, info.value.key) == (COMMAND_LINE, "--sandbox-image")


def test_the_cgroup_driver_is_cgroupfs_unless_systemd_is_asked_for(write, missing) -> None:
    assert config.load(default_path=missing).cgroup_driver == "cgroupfs"
    assert config.load(write('cgroup_driver = "cgroupfs"\n')).cgroup_driver == "cgroupfs"
    assert config.load(write('cgroup_driver = "systemd"\n')).cgroup_driver == "systemd"
    with pytest.raises(config.ConfigError, match=r"cgroup_driver: must be one of 'cgroupfs', 'systemd', not 'slices'"):
        config.load(write('cgroup_driver = "slices"\n'))


def test_a_cgroup_parent_must_be_what_the_cgroup_driver_takes(write) -> None:
    with pytest.raises(config.ConfigError, match=r"cgroup_parent: cgroup parent 'kubepods.slice' is a systemd slice, "
                                                 r"and the cgroup driver is cgroupfs"):
        config.load(write('cgroup_parent = "kubepods.slice"\n'))
    with pytest.raises(config.ConfigError, match=r"cgroup_parent: cgroup parent '/kubepods' is a path, and the cgroup "
                                                 r"driver is systemd"):
        config.load(write('cgroup_driver = "systemd"\ncgroup_parent = "/kubepods"\n'))
    assert config.load(write('cgroup_driver = "systemd"\ncgroup_parent = "kubepods-besteffort.slice"\n')).cgroup_parent \
        == "kubepods-besteffort.slice"
