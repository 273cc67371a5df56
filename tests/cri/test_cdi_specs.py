"""CDI spec files read as the CDI specification and its reference implementation read them: JSON
and YAML through one validator, a broken file skipped with a warning naming it, versions known up
to 1.1.0, and every field of containerEdits applied or refused with a sentence."""

from __future__ import annotations

import json
import logging
import os

import pytest

from shim.rpc.status import FailedPrecondition, InvalidArgument

from client.cri import cdi

GPU = {
    "cdiVersion": "0.6.0",
    "kind": "example.com/gpu",
    "containerEdits": {"env": ["VENDOR=example"], "additionalGids": []},
    "devices": [{"name": "gpu0", "containerEdits": {
        "env": ["GPU=0"],
        "deviceNodes": [{"path": "/dev/gpu0", "hostPath": "/dev/null", "type": "c", "major": 1, "minor": 3,
                         "fileMode": 0o640, "permissions": "rw", "uid": 10, "gid": 20}],
        "mounts": [{"hostPath": "/opt", "containerPath": "/opt/gpu", "options": ["ro", "rbind"]}],
        "hooks": [{"hookName": "createContainer", "path": "/bin/true", "args": ["true", "x"], "env": ["A=1"],
                   "timeout": 5}]}}],
}
GPU_YAML = """\
---
cdiVersion: 0.6.0
kind: example.com/gpu
containerEdits:
  env: [VENDOR=example]
  additionalGids: []
devices:
- name: gpu0
  containerEdits:
    env:
    - GPU=0
    deviceNodes:
    - {path: /dev/gpu0, hostPath: /dev/null, type: c, major: 1, minor: 3, fileMode: 0o640, permissions: rw,
       uid: 10, gid: 20}
    mounts:
    - hostPath: /opt
      containerPath: /opt/gpu
      options: [ro, rbind]
    hooks:
    - hookName: createContainer
      path: /bin/true
      args: ["true", x]
      env: [A=1]
      timeout: 5
"""


def write(directory, name: str, content) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))
    return path


def spec(**edits) -> dict:
    """A spec of one device, example.com/x=d, with ``edits`` as its containerEdits."""
    return {"cdiVersion": "1.1.0", "kind": "example.com/x", "devices": [{"name": "d", "containerEdits": edits}]}


def resolve(tmp_path, *names: str) -> cdi.CdiEdits:
    return cdi.resolve(names, [str(tmp_path)])


def test_a_yaml_spec_gives_what_the_same_json_spec_gives(tmp_path) -> None:
    (tmp_path / "json").mkdir()
    (tmp_path / "yaml").mkdir()
    write(tmp_path / "json", "gpu.json", GPU)
    write(tmp_path / "yaml", "gpu.yaml", GPU_YAML.replace("0o640", str(0o640)))
    from_json = cdi.resolve(["example.com/gpu=gpu0"], [str(tmp_path / "json")])
    from_yaml = cdi.resolve(["example.com/gpu=gpu0"], [str(tmp_path / "yaml")])
    assert from_json == from_yaml
    assert from_json.env == ["VENDOR=example", "GPU=0"]
    assert from_json.devices == [{"container_path": "/dev/gpu0", "host_path": "/dev/null", "permissions": "rw",
                                  "type": "c", "major": 1, "minor": 3, "file_mode": 0o640, "uid": 10, "gid": 20}]
    assert from_json.mounts == [{"destination": "/opt/gpu", "source": "/opt", "type": "bind",
                                 "options": ["ro", "rbind"]}]
    assert from_json.hooks == [{"hook_name": "createContainer", "path": "/bin/true", "args": ["true", "x"],
                                "env": ["A=1"], "timeout": 5}]


def test_a_yml_file_is_read_too(tmp_path) -> None:
    write(tmp_path, "x.yml", "cdiVersion: 0.3.0\nkind: example.com/x\ndevices:\n- name: d\n  containerEdits:\n"
                             "    env: [FROM=yml]\n")
    assert resolve(tmp_path, "example.com/x=d").env == ["FROM=yml"]


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("bad.yaml", "cdiVersion: 0.6.0\nkind: [unclosed\n", "it is not valid YAML"),
    ("bad.json", '{"cdiVersion": "0.6.0",', "it is not valid JSON"),
    ("bad.json", spec(env=["NOEQUALS"]), "'NOEQUALS' is not KEY=value"),
    ("bad.json", spec(colour="red"), "has 'colour', which is no field of a CDI spec"),
    ("bad.json", spec(hooks=[{"hookName": "atLunch", "path": "/bin/true"}]), "hookName 'atLunch' is not one of"),
    ("bad.json", spec(deviceNodes=[{"path": "/dev/x", "type": "z"}]), "type 'z' is not one of b, c, u, p"),
    ("bad.json", {**spec(), "cdiVersion": "1.2.0"}, "cdiVersion '1.2.0' is not a CDI version podshim knows "
                                                    "(0.3.0 to 1.1.0)"),
    ("bad.json", {**spec(additionalGids=[5]), "cdiVersion": "0.6.0"},
     "the fields it uses need cdiVersion 0.7.0 or later, and it says 0.6.0"),
])
def test_a_broken_spec_is_skipped_with_a_warning_and_its_device_is_invalid_argument(tmp_path, caplog, name,
                                                                                      content, reason) -> None:
    path = write(tmp_path, name, content)
    write(tmp_path, "good.json", {**spec(env=["GOOD=1"]), "kind": "example.com/good"})
    with caplog.at_level(logging.WARNING, logger="client.cri.cdi"):
        assert resolve(tmp_path, "example.com/good=d").env == ["GOOD=1"]  # the others are read
    assert any(f"CDI spec {path} skipped: " in r.getMessage() and reason in r.getMessage() for r in caplog.records)
    with pytest.raises(InvalidArgument) as raised:
        resolve(tmp_path, "example.com/x=d")
    assert "CDI device 'example.com/x=d' is not defined by any valid CDI spec" in raised.value.message
    assert f"{path} was skipped: " in raised.value.message and reason in raised.value.message


@pytest.mark.parametrize("version", cdi.KNOWN_VERSIONS)
def test_every_version_of_the_reference_is_read(tmp_path, version) -> None:
    write(tmp_path, "x.json", {"cdiVersion": version, "kind": "example.com/x",
                               "devices": [{"name": "d", "containerEdits": {"env": ["V=1"]}}]})
    assert resolve(tmp_path, "example.com/x=d").env == ["V=1"]


@pytest.mark.parametrize(("edits", "sentence"), [
    ({"intelRdt": {"closID": "gold"}}, "has intelRdt, which podshim cannot apply"),
    ({"netDevices": [{"hostInterfaceName": "eth9", "name": "net1"}]}, "has netDevices, which podshim cannot apply"),
    ({"mounts": [{"hostPath": "tmpfs", "containerPath": "/t", "type": "tmpfs"}]},
     "mounts[0] is of type 'tmpfs'; podshim applies bind mounts only"),
    ({"deviceNodes": [{"path": "/dev/fifo", "type": "p"}]}, "deviceNodes[0] is a FIFO, which podshim cannot make"),
    ({"deviceNodes": [{"path": "/dev/null", "permissions": "none"}]}, "has permissions 'none', which podshim cannot "
                                                                      "apply"),
])
def test_what_podshim_cannot_apply_is_refused_naming_the_file(tmp_path, edits, sentence) -> None:
    path = write(tmp_path, "x.json", spec(**edits))
    with pytest.raises(FailedPrecondition) as raised:
        resolve(tmp_path, "example.com/x=d")
    assert raised.value.message.startswith(f"CDI spec {path}: device 'd'")
    assert sentence in raised.value.message


def test_spec_level_edits_come_once_and_first(tmp_path) -> None:
    write(tmp_path, "x.json", {"cdiVersion": "0.7.0", "kind": "example.com/x",
                               "containerEdits": {"env": ["SPEC=1"], "additionalGids": [7, 0]},
                               "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}},
                                           {"name": "b", "containerEdits": {"additionalGids": [8]}}]})
    edits = resolve(tmp_path, "example.com/x=a", "example.com/x=b")
    assert edits.env == ["SPEC=1", "A=1"]
    assert edits.additional_gids == [7, 8]  # gid 0 is no additional group (as CDI's)


def test_a_device_twice_in_one_directory_is_refused_when_asked_for(tmp_path) -> None:
    first = write(tmp_path, "a.json", spec(env=["A=1"]))
    second = write(tmp_path, "b.yaml", json.dumps(spec(env=["B=1"])))  # JSON is YAML too
    write(tmp_path, "c.json", {**spec(), "kind": "example.com/other"})
    assert resolve(tmp_path, "example.com/other=d").env == []
    with pytest.raises(FailedPrecondition) as raised:
        resolve(tmp_path, "example.com/x=d")
    assert f"defined twice in {tmp_path} ({first} and {second})" in raised.value.message


def test_a_spec_as_nvidia_ctk_writes_one_is_read(tmp_path) -> None:
    """The shape of nvidia-ctk's generated specs: YAML, 0.5.0, numbered devices, library binds with
    bind among their options, createContainer hooks of a host program."""
    write(tmp_path, "nvidia.yaml", """\
---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - update-ldcache
    - --folder
    - /usr/lib/x86_64-linux-gnu
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options:
    - ro
    - nosuid
    - nodev
    - bind
""")
    edits = resolve(tmp_path, "nvidia.com/gpu=0")
    assert edits.env == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert [d["container_path"] for d in edits.devices] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert edits.mounts[0]["options"] == ["ro", "nosuid", "nodev", "bind"]
    assert edits.hooks == [{"hook_name": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                            "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
                            "env": []}]
