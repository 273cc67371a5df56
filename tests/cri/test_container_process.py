"""A container's process from its CRI config and its image's config, as kubelet and containerd
specify: command/args over Entrypoint/Cmd, env merged (CRI over image), working directory (CRI over
image, else /), the image's user kept for the resolver."""

from __future__ import annotations

import pytest

from shim.cri.configs import ContainerConfig
from shim.rpc.status import InvalidArgument

from client.cri.process import DEFAULT_PATH, container_process, merge_env

IMAGE = {"Entrypoint": ["/entry"], "Cmd": ["--cmd"], "Env": ["PATH=/image/bin", "A=image", "B=image"],
         "WorkingDir": "/image-dir", "User": "nobody"}


def config(**fields) -> ContainerConfig:
    return ContainerConfig.from_json({"metadata": {"name": "c"}, "image": {"image": "img"}, **fields})


@pytest.mark.parametrize("fields, image, argv", [
    ({}, IMAGE, ("/entry", "--cmd")),                                     # neither: Entrypoint + Cmd
    ({"command": ["/cmd"]}, IMAGE, ("/cmd",)),                            # command replaces both
    ({"command": ["/cmd"], "args": ["a"]}, IMAGE, ("/cmd", "a")),
    ({"args": ["a", "b"]}, IMAGE, ("/entry", "a", "b")),                  # args alone replace Cmd only
    ({}, {"Cmd": ["sh"]}, ("sh",)),                                       # no Entrypoint
    ({"args": ["x"]}, {"Cmd": ["sh"]}, ("x",)),
    ({}, {"Entrypoint": [""], "Cmd": ["sh"]}, ("sh",)),                   # [""] clears the Entrypoint
    ({}, {"Entrypoint": ["/e"]}, ("/e",)),                                # no Cmd
    ({"command": ["/cmd"]}, None, ("/cmd",)),                             # no image at all
])
def test_command_and_args_override_the_image_as_kubelet_specifies(fields, image, argv) -> None:
    assert container_process(config(**fields), image, hostname="h").args == argv


@pytest.mark.parametrize("fields, image", [({}, {}), ({}, None), ({}, {"Entrypoint": [""]}), ({"args": []}, {})])
def test_nothing_to_run_is_invalid_argument(fields, image) -> None:
    with pytest.raises(InvalidArgument, match="no command specified"):
        container_process(config(**fields), image, hostname="h")


def test_env_is_default_path_and_hostname_then_image_then_cri_each_replacing_earlier_values() -> None:
    cfg = config(envs=[{"key": "B", "value": "cri"}, {"key": "C", "value": "cri"}])
    assert container_process(cfg, IMAGE, hostname="pod-host").env == (
        "PATH=/image/bin", "HOSTNAME=pod-host", "A=image", "B=cri", "C=cri")


def test_env_without_image_has_the_default_path() -> None:
    assert container_process(config(command=["x"]), None, hostname="h").env == (f"PATH={DEFAULT_PATH}", "HOSTNAME=h")


def test_merge_env_keeps_first_place_and_last_value() -> None:
    assert merge_env(["A=1", "B=2"], ["A=3", "C"], ["B="]) == ("A=3", "B=", "C")


@pytest.mark.parametrize("fields, image, cwd", [
    ({"working_dir": "/cri"}, IMAGE, "/cri"),
    ({}, IMAGE, "/image-dir"),
    ({}, {"Cmd": ["sh"]}, "/"),
])
def test_working_dir_is_cri_then_image_then_root(fields, image, cwd) -> None:
    assert container_process(config(**fields), image, hostname="h").cwd == cwd


def test_the_image_user_is_handed_on() -> None:
    assert container_process(config(), IMAGE, hostname="h").image_user == "nobody"
    assert container_process(config(), {"Cmd": ["sh"]}, hostname="h").image_user == ""


@pytest.mark.parametrize("image, message", [
    ({"Cmd": "sh"}, "config.Cmd is not an array of strings"),
    ({"Cmd": ["sh"], "Env": [1]}, "config.Env is not an array of strings"),
    ({"Cmd": ["sh"], "WorkingDir": "rel"}, "WorkingDir 'rel' is not an absolute path"),
])
def test_a_malformed_image_config_is_refused_with_a_sentence(image, message) -> None:
    with pytest.raises(InvalidArgument, match=message):
        container_process(config(), image, hostname="h")
