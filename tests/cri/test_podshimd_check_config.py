"""``podshimd --check-config`` and ``podshimd --print-default-config``, run as an operator runs them."""

from __future__ import annotations

import os
import subprocess
import sys

from client.podshimd import config
from client.podshimd.config import Config

from support.critools import REPO


def podshimd(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "client.podshimd", *argv], cwd=REPO, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)


def node(tmp_path, conflist: str | None = '{"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "bridge"}]}'):
    """A config of the test's own: its roots under ``tmp_path``, a CNI conf dir (with ``conflist``)
    and a bin dir holding a 'bridge' plugin. The config file's path."""
    (tmp_path / "net.d").mkdir()
    if conflist is not None:
        (tmp_path / "net.d" / "10-n.conflist").write_text(conflist)
    plugins = tmp_path / "cni"
    plugins.mkdir()
    (plugins / "bridge").write_text("#!/bin/sh\n")
    (plugins / "bridge").chmod(0o755)
    path = tmp_path / "config.toml"
    path.write_text(f'state_root = "{tmp_path}/state"\nruntime_root = "{tmp_path}/run"\n'
                    f'cni_conf_dir = "{tmp_path}/net.d"\ncni_bin_dirs = ["{plugins}"]\nruntime_handlers = ["native"]\n')
    return str(path)


def test_a_good_config_is_ok_and_exits_0(tmp_path) -> None:
    path = node(tmp_path)
    done = podshimd("--check-config", "--config", path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"podshimd: {path}: OK\n" and done.stderr == ""
    assert not os.path.exists(tmp_path / "state") and not os.path.exists(tmp_path / "run")  # nothing made


def test_a_mistyped_flag_is_named_with_the_flag_it_may_mean_and_exits_2(tmp_path) -> None:
    done = podshimd("--chek-config", "--config", node(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.endswith("podshimd: error: unknown option '--chek-config'; did you mean '--check-config' or "
                                "'--config'?\n"), done.stderr
    assert not os.path.exists(tmp_path / "state") and not os.path.exists(tmp_path / "run")


def test_a_mistyped_key_is_named_with_the_key_it_may_mean_and_exits_1(tmp_path) -> None:
    path = node(tmp_path)
    with open(path, "a") as f:
        f.write('lisen = "unix:///run/x.sock"\n')
    done = podshimd("--check-config", "--config", path)
    assert done.returncode == 1
    assert done.stderr == f"podshimd: {path}: lisen: unknown key (did you mean 'listen'?)\n"


def test_a_conflist_naming_a_plugin_that_is_not_installed_is_an_error(tmp_path) -> None:
    path = node(tmp_path, '{"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "bridge"}, {"type": "portmap"}]}')
    done = podshimd("--check-config", "--config", path)
    assert done.returncode == 1
    assert f"error: cni_bin_dirs: {tmp_path}/net.d/10-n.conflist uses the plugin 'portmap', which is in none of " \
           f"{tmp_path}/cni" in done.stderr


def test_a_bad_conflist_is_an_error_naming_its_file(tmp_path) -> None:
    path = node(tmp_path, '{"cniVersion": "1.0.0", "name": "n", "plugins": []}')
    done = podshimd("--check-config", "--config", path)
    assert done.returncode == 1
    assert f"error: cni_conf_dir: the CNI network config is not valid: {tmp_path}/net.d/10-n.conflist: plugins " \
           "must be a non-empty array" in done.stderr


def test_no_conflist_is_a_warning_and_still_exits_0(tmp_path) -> None:
    path = node(tmp_path, conflist=None)
    done = podshimd("--check-config", "--config", path)
    assert done.returncode == 0
    assert "warning: cni_conf_dir: no CNI network config" in done.stderr
    assert done.stdout == f"podshimd: {path}: OK (1 warning(s))\n"


def test_a_missing_pause_and_a_root_under_a_file_are_errors(tmp_path) -> None:
    path = node(tmp_path)
    (tmp_path / "afile").write_text("")
    with open(path, "a") as f:
        f.write(f'sandbox_binary = "{tmp_path}/no-catatonit"\n')
    done = podshimd("--check-config", "--config", path, "--state-root", f"{tmp_path}/afile/state")
    assert done.returncode == 1
    assert f"error: sandbox_binary: {tmp_path}/no-catatonit is not an executable file" in done.stderr
    assert f"error: state_root: {tmp_path}/afile/state cannot be a directory: {tmp_path}/afile is not one" \
        in done.stderr
    assert "2 error(s)" in done.stderr


def test_a_runtime_handler_without_its_binary_is_an_error(tmp_path, monkeypatch) -> None:
    from client.podshimd import checkconfig

    path = node(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(checkconfig, "_SEARCH_PATH", str(tmp_path / "cni"))
    found = checkconfig.check(config.load(path, {"runtime_handlers": ["native", "crun"]}))
    assert [(f.level, f.key) for f in found] == [("error", "runtime_handlers")]
    assert "runtime handler 'crun' needs the crun binary" in found[0].message
    (tmp_path / "crun").write_text("#!/bin/sh\n")
    (tmp_path / "crun").chmod(0o755)
    assert checkconfig.check(config.load(path, {"runtime_handlers": ["native", "crun"]})) == []


def test_the_systemd_cgroup_driver_needs_systemd_and_pure_cgroup_v2(tmp_path, monkeypatch) -> None:
    from client.podshimd import checkconfig

    path = node(tmp_path)
    monkeypatch.setattr(checkconfig, "_SYSTEMD_BOOTED", str(tmp_path / "run-systemd-system"))
    monkeypatch.setattr(checkconfig, "_CGROUP2_ROOT", str(tmp_path / "cgroup.controllers"))
    systemd = config.load(path, {"cgroup_driver": "systemd"})
    assert [(f.key, f.message.split(",")[0]) for f in checkconfig.check(systemd)] == [
        ("cgroup_driver", "the systemd cgroup driver needs systemd as the init of this machine"),
        ("cgroup_driver", "the systemd cgroup driver needs a pure cgroup v2 machine (/sys/fs/cgroup is not the "
                          "unified hierarchy): use cgroupfs")]
    (tmp_path / "run-systemd-system").mkdir()
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert checkconfig.check(systemd) == []
    assert checkconfig.check(config.load(path)) == []  # cgroupfs needs neither


def test_the_default_config_printed_loads_back_to_the_defaults_and_checks(tmp_path) -> None:
    done = podshimd("--print-default-config")
    assert done.returncode == 0 and done.stderr == ""
    path = tmp_path / "config.toml"
    path.write_text(done.stdout)
    assert config.load(str(path)) == Config()
    # Every key of the schema is in it, set or (listen, sandbox_image) commented.
    for field in Config.__dataclass_fields__:
        assert f"\n{field} = " in done.stdout or f"\n# {field} = " in done.stdout or field == "registries"
    checked = podshimd("--check-config", "--config", str(path))
    assert "unknown key" not in checked.stderr and checked.returncode in (0, 1)
