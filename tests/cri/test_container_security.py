"""CRI's LinuxContainerSecurityContext -> Task.Create's confinement fields, as containerd's CRI
translates it (shim/cri/security.py), then applied for real by each runtime handler."""

from __future__ import annotations

import errno
import json
import os
import pathlib

import pytest

from shim.api.defaults import DEFAULT_CAPABILITIES
from shim.cri import security
from shim.cri.configs import ContainerConfig, PodSandboxConfig
from shim.cri.seccomp_default import default_profile
from shim.cri.security import MAX_NODE_FILE_BYTES
from shim.kernel import capabilities as caps
from shim.kernel import seccomp
from shim.rpc.status import InvalidArgument

from support.podtools import NodeRootImages, node_container, pod_config, pod_service

ALL = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_KILL", "CAP_SYS_ADMIN", "CAP_NET_ADMIN")
PASSWD = b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\nnogroup-user:x:2000:2000::/:/bin/sh\n"
GROUP = b"root:x:0:\napp:x:1001:\nwheel:x:10:app,other\naudio:x:29:app\nvideo:x:44:other\n"


def _fifo(path: pathlib.Path) -> str:
    os.mkfifo(path)
    return str(path)


def files(path: str) -> bytes | None:
    return {"/etc/passwd": PASSWD, "/etc/group": GROUP}.get(path)


def translate(context: dict, *, pod_privileged: bool = False, image_user: str = "", **kwargs) -> dict:
    sec = security.ContainerSecurity.from_doc(context)
    return security.task_fields(sec, pod_privileged=pod_privileged, read_file=files, image_user=image_user,
                                all_caps=ALL, **kwargs)


# -- capabilities --------------------------------------------------------------------------


@pytest.mark.parametrize(("add", "drop", "expected"), [
    ([], [], list(DEFAULT_CAPABILITIES)),
    (["NET_ADMIN"], [], [*DEFAULT_CAPABILITIES, "CAP_NET_ADMIN"]),
    (["cap_net_admin"], ["CHOWN", "kill"], [c for c in DEFAULT_CAPABILITIES if c not in ("CAP_CHOWN", "CAP_KILL")]
     + ["CAP_NET_ADMIN"]),
    (["ALL"], [], list(ALL)),
    (["ALL"], ["CHOWN"], [c for c in ALL if c != "CAP_CHOWN"]),
    ([], ["ALL"], []),
    (["NET_ADMIN"], ["ALL"], ["CAP_NET_ADMIN"]),  # "ALL" first, then the names: containerd's order
    (["all"], ["all"], []),
])
def test_capabilities_add_and_drop_as_containerd(add, drop, expected) -> None:
    fields = translate({"capabilities": {"add_capabilities": add, "drop_capabilities": drop}})
    assert fields["capabilities"] == expected


def test_privileged_gets_every_capability_no_filter_and_the_privileged_field() -> None:
    fields = translate({"privileged": True, "seccomp": {"profile_type": "RuntimeDefault"},
                        "capabilities": {"drop_capabilities": ["ALL"]}, "masked_paths": ["/proc/kcore"]},
                       pod_privileged=True)
    assert fields["capabilities"] == list(ALL) and fields["privileged"] is True
    assert "seccomp" not in fields and "masked_paths" not in fields and "readonly_paths" not in fields


def test_a_privileged_container_is_refused_in_a_pod_that_is_not() -> None:
    with pytest.raises(InvalidArgument, match="privileged"):
        translate({"privileged": True})


def test_the_pods_privileged_flag_is_read_from_its_security_context() -> None:
    cfg = pod_config()
    cfg["linux"]["security_context"]["privileged"] = True
    assert PodSandboxConfig.from_json(cfg).security.privileged
    assert not PodSandboxConfig.from_json(pod_config()).security.privileged


# -- users and groups ------------------------------------------------------------------------


@pytest.mark.parametrize(("context", "image_user", "expected"), [
    ({}, "", {"uid": 0, "gid": 0, "additional_gids": [0]}),
    ({"run_as_user": {"value": 1000}}, "", {"uid": 1000, "gid": 1001, "additional_gids": [10, 29, 1001]}),
    ({"run_as_user": {"value": "1000"}}, "", {"uid": 1000, "gid": 1001, "additional_gids": [10, 29, 1001]}),
    ({"run_as_user": {"value": 4242}}, "", {"uid": 4242, "gid": 0, "additional_gids": [0]}),  # no entry: gid 0
    ({"run_as_user": {"value": 1000}, "run_as_group": {"value": 5}}, "",
     {"uid": 1000, "gid": 5, "additional_gids": [5, 10, 29]}),
    ({"run_as_username": "app"}, "", {"uid": 1000, "gid": 1001, "additional_gids": [10, 29, 1001]}),
    ({"run_as_username": "app", "run_as_group": {"value": 7}, "supplemental_groups": [3000, "29"]}, "",
     {"uid": 1000, "gid": 7, "additional_gids": [7, 10, 29, 3000]}),
    ({"run_as_user": {}}, "", {"uid": 0, "gid": 0, "additional_gids": [0]}),  # an empty Int64Value is 0
    ({}, "app", {"uid": 1000, "gid": 1001, "additional_gids": [10, 29, 1001]}),  # the image's User
    ({}, "app:video", {"uid": 1000, "gid": 44, "additional_gids": [10, 29, 44]}),
    ({"run_as_user": {"value": 2000}}, "app", {"uid": 2000, "gid": 2000, "additional_gids": [2000]}),  # CRI first
])
def test_user_group_and_supplemental_groups_as_containerd(context, image_user, expected) -> None:
    assert translate(context, image_user=image_user)["user"] == expected


@pytest.mark.parametrize(("context", "image_user", "words"), [
    ({"run_as_group": {"value": 5}}, "", "run_as_group is set without run_as_user"),
    ({"run_as_username": "nobody-here"}, "", "'nobody-here' is not in the container's /etc/passwd"),
    ({}, "app:nogroup", "'nogroup' is not in the container's /etc/group"),
    ({"run_as_user": {"value": -1}}, "", "run_as_user.value"),
    ({"supplemental_groups": ["x"]}, "", r"supplemental_groups\[0\]"),
])
def test_bad_users_are_refused_naming_the_field(context, image_user, words) -> None:
    with pytest.raises(InvalidArgument, match=words):
        translate(context, image_user=image_user)


def test_without_an_etc_passwd_a_uid_has_group_0() -> None:
    sec = security.ContainerSecurity.from_doc({"run_as_user": {"value": 33}})
    assert security.task_fields(sec, pod_privileged=False, read_file=lambda path: None,
                                all_caps=ALL)["user"] == {"uid": 33, "gid": 0, "additional_gids": [0]}


# -- seccomp, no_new_privs, paths, LSMs --------------------------------------------------------


def test_seccomp_absent_or_unconfined_is_no_filter() -> None:
    assert "seccomp" not in translate({})
    assert "seccomp" not in translate({"seccomp": {"profile_type": "Unconfined"}})
    assert "seccomp" not in translate({"seccomp_profile_path": "unconfined"})


@pytest.mark.parametrize("context", [{"seccomp": {}}, {"seccomp": {"profile_type": 0}},
                                     {"seccomp_profile_path": "runtime/default"},
                                     {"seccomp_profile_path": "docker/default"}])
def test_runtime_default_is_containerds_default_profile_for_the_containers_capabilities(context) -> None:
    fields = translate(context)
    assert fields["seccomp"] == default_profile(fields["capabilities"])


def test_the_default_profile_allows_namespaces_only_with_cap_sys_admin() -> None:
    def allowed(profile):
        return {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
                for n in rule["names"]}
    plain, admin = default_profile(DEFAULT_CAPABILITIES), default_profile([*DEFAULT_CAPABILITIES, "CAP_SYS_ADMIN"])
    for name in ("unshare", "setns", "mount", "keyctl", "add_key", "init_module", "reboot", "bpf"):
        assert name not in allowed(plain), name
    assert {"unshare", "setns", "mount"} <= allowed(admin)
    assert {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS} in plain["syscalls"]
    for profile in (plain, admin):
        seccomp.validate(profile)
        assert seccomp.compile_profile(profile)


def test_a_localhost_profile_is_read_from_the_node_keeping_only_oci_keys(tmp_path) -> None:
    path = tmp_path / "deny-mkdir.json"
    path.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "archMap": [{"architecture": "x"}],
                                "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO", "comment": "no"}]}))
    expected = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO"}]}
    assert translate({"seccomp": {"profile_type": "Localhost", "localhost_ref": str(path)}})["seccomp"] == expected
    assert translate({"seccomp": {"profile_type": 2, "localhost_ref": f"localhost/{path}"}})["seccomp"] == expected
    assert translate({"seccomp_profile_path": f"localhost/{path}"})["seccomp"] == expected


@pytest.mark.parametrize(("context", "words"), [
    ({"seccomp_profile_path": "/etc/profile.json"}, "localhost/<absolute path>"),
    ({"seccomp": {"profile_type": "Localhost", "localhost_ref": "relative.json"}}, "absolute path"),
    ({"seccomp": {"profile_type": "Localhost", "localhost_ref": "/no/such/profile.json"}}, "cannot read"),
    ({"seccomp": {"profile_type": "RuntimeDefault", "localhost_ref": "/x.json"}}, "only be set if"),
    ({"seccomp": {"profile_type": 7}}, "profile_type"),
    ({"apparmor": {"profile_type": "RuntimeDefault"}}, "no AppArmor"),
    ({"apparmor": {}}, "no AppArmor"),
    ({"apparmor_profile": "localhost/k8s-default"}, "no AppArmor"),
    ({"selinux_options": {"type": "spc_t"}}, "no SELinux"),
    ({"masked_paths": ["proc/kcore"]}, "absolute path"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(context, words) -> None:
    with pytest.raises(InvalidArgument, match=words):
        translate(context)


@pytest.mark.parametrize(("make", "words"), [
    (lambda d: "/dev/zero", "not a regular file \\(a character device\\)"),
    (lambda d: _fifo(d / "fifo"), "not a regular file \\(a FIFO\\)"),
    (lambda d: str(d), "not a regular file \\(a directory\\)"),
    (lambda d: (d / "big.json").write_bytes(b" " * (MAX_NODE_FILE_BYTES + 1)) and str(d / "big.json"),
     f"larger than {MAX_NODE_FILE_BYTES} bytes"),
])
def test_a_localhost_profile_that_is_no_regular_file_or_too_large_is_refused_without_reading_it(tmp_path, make, words) -> None:
    """A profile path at /dev/zero must not grow the daemon without end, nor a FIFO hang its
    CreateContainer: both are refused at once with a sentence."""
    ref = make(tmp_path)
    with pytest.raises(InvalidArgument, match=f"cannot read seccomp profile {ref}: {words}"):
        translate({"seccomp": {"profile_type": "Localhost", "localhost_ref": ref}})


def test_unconfined_apparmor_is_accepted() -> None:
    translate({"apparmor": {"profile_type": "Unconfined"}, "apparmor_profile": "unconfined"})


def test_no_new_privs_masked_and_readonly_paths_pass_through() -> None:
    fields = translate({"no_new_privs": True, "masked_paths": ["/proc/kcore"], "readonly_paths": ["/proc/sys"]})
    assert fields["no_new_privileges"] is True
    assert fields["masked_paths"] == ["/proc/kcore"] and fields["readonly_paths"] == ["/proc/sys"]
    assert "masked_paths" not in translate({})  # absent: the shim's defaults (runc's)


def test_a_container_config_keeps_its_security_context_through_json() -> None:
    doc = node_container(["true"])
    doc["linux"]["security_context"].update({
        "privileged": True, "capabilities": {"add_capabilities": ["NET_ADMIN"]}, "run_as_user": {"value": 5},
        "run_as_group": {"value": 6}, "supplemental_groups": [7], "no_new_privs": True,
        "seccomp": {"profile_type": "Localhost", "localhost_ref": "/p.json"}, "masked_paths": ["/a"]})
    cfg = ContainerConfig.from_json(doc)
    assert ContainerConfig.from_json(cfg.to_json()) == cfg
    assert cfg.security.run_as_user == 5 and cfg.security.supplemental_groups == (7,)


# -- applied for real, through the pod layer, by each handler -----------------------------------

BUSYBOX = "/bin/busybox"


async def run_to_exit(pods, pod_id: str, command: list[str], context: dict) -> list[str]:
    """Create and start a container with ``context`` as its security context; its log lines once it exited."""
    cfg = node_container(command, name=f"c{os.urandom(3).hex()}")
    cfg["linux"]["security_context"].update(context)
    cid = await pods.create_container(pod_id, cfg)
    await pods.start_container(cid)
    await pods._task(pod_id, "Wait", {"task_id": cid}, timeout=30)  # the shim answers at the exit: no polling
    with open(pods.container_log_path(cid)) as f:
        return [line.rstrip("\n").split(" ", 3)[3] for line in f]


@pytest.fixture(params=["native", "runc", "crun"])
def handler(request) -> str:
    import shutil
    if request.param != "native" and not shutil.which(request.param, path="/usr/sbin:/usr/bin:/sbin:/bin"):
        pytest.skip(f"{request.param} is not installed")
    return request.param


async def test_runtime_default_blocks_what_containerds_profile_blocks_and_ordinary_programs_run(handler, roots) -> None:
    script = ("unshare -U true; echo unshare=$?; "
              "/usr/bin/python3 -c 'import ctypes,os; l=ctypes.CDLL(None,use_errno=True); "
              "print(\"keyctl\", l.syscall(250, 0, 0, 0, 0), ctypes.get_errno())'; "
              "grep Seccomp: /proc/self/status; ls / > /dev/null && echo ls=$?")
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config(), runtime_handler=handler)
        lines = await run_to_exit(pods, pod_id, [BUSYBOX, "sh", "-c", script], {"seccomp": {}})
        assert "unshare=1" in lines and any("Operation not permitted" in line for line in lines), lines
        assert f"keyctl -1 {errno.EPERM}" in lines, lines
        assert "Seccomp:\t2" in lines and "ls=0" in lines, lines
        unconfined = await run_to_exit(pods, pod_id, [BUSYBOX, "sh", "-c", "grep Seccomp: /proc/self/status"], {})
        assert unconfined == ["Seccomp:\t0"]


async def test_a_localhost_profile_that_denies_mkdir(handler, roots, tmp_path) -> None:
    profile = tmp_path / "deny-mkdir.json"
    profile.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW",
                                   "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}))
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config(), runtime_handler=handler)
        lines = await run_to_exit(pods, pod_id, [BUSYBOX, "sh", "-c", "mkdir /dev/shm/d; echo rc=$?"],
                                  {"seccomp": {"profile_type": "Localhost", "localhost_ref": str(profile)}})
        assert "rc=1" in lines and any("Operation not permitted" in line for line in lines), lines


async def test_run_as_user_and_capabilities_reach_the_process(handler, roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config(), runtime_handler=handler)
        lines = await run_to_exit(pods, pod_id, [BUSYBOX, "cat", "/proc/self/status"], {
            "run_as_user": {"value": 4242}, "run_as_group": {"value": 4243}, "supplemental_groups": [4244],
            "capabilities": {"drop_capabilities": ["ALL"], "add_capabilities": ["NET_ADMIN"]}, "no_new_privs": True})
        status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
        assert status["Uid"].split() == ["4242"] * 4 and status["Gid"].split() == ["4243"] * 4
        assert status["Groups"].split() == ["4243", "4244"]
        assert int(status["CapBnd"], 16) == caps.mask(["CAP_NET_ADMIN"]) and int(status["CapEff"], 16) == 0
        assert status["NoNewPrivs"] == "1"


async def test_a_privileged_container_needs_a_privileged_pod(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        cfg = node_container(["true"])
        cfg["linux"]["security_context"]["privileged"] = True
        with pytest.raises(InvalidArgument, match="privileged"):
            await pods.create_container(pod_id, cfg)
        assert await pods.list_containers() == []


async def test_a_privileged_container_of_a_privileged_pod_opens_the_hosts_devices(handler, roots) -> None:
    extra = [path for path in ("/dev/loop-control", "/dev/kmsg") if os.path.exists(path)]  # not in runc's defaults
    if not extra:
        pytest.skip("the host has neither /dev/loop-control nor /dev/kmsg")
    async with pod_service(roots) as pods:
        cfg = pod_config()
        cfg["linux"]["security_context"]["privileged"] = True
        pod_id = await pods.run_pod_sandbox(cfg, runtime_handler=handler)
        lines = await run_to_exit(pods, pod_id, [BUSYBOX, "sh", "-c", "for d in " + " ".join(extra) + "; do "
                                                 "(: < $d) && echo opened $d; done 2>&1"], {"privileged": True})
        assert lines == [f"opened {path}" for path in extra]


def test_a_privileged_pod_says_so_to_the_shim() -> None:
    cfg = pod_config()
    assert "privileged" not in PodSandboxConfig.from_json(cfg).to_shim_options()["linux"]["security_context"]
    cfg["linux"]["security_context"]["privileged"] = True
    assert PodSandboxConfig.from_json(cfg).to_shim_options()["linux"]["security_context"]["privileged"] is True


async def test_a_pod_asking_for_selinux_or_apparmor_is_refused(roots) -> None:
    async with pod_service(roots) as pods:
        cfg = pod_config()
        cfg["linux"]["security_context"]["selinux_options"] = {"level": "s0:c1,c2"}
        with pytest.raises(InvalidArgument, match="no SELinux"):
            await pods.run_pod_sandbox(cfg)
        assert await pods.list_pod_sandbox() == []


class ImageSnapshots:
    """A stand-in snapshotter whose image has its own /etc/passwd and /etc/group."""

    files = {"/etc/passwd": b"root:x:0:0::/:/bin/sh\nweb:x:4321:4322::/:/bin/sh\n",
             "/etc/group": b"web:x:4322:\nlog:x:4400:web\n"}

    def __init__(self) -> None:
        self.reads: list[tuple[str, str]] = []

    async def prepare(self, key: str, chain_id: str) -> list:
        return NodeRootImages().prepare(key, chain_id)  # no layers: the container runs on the node's root

    def remove(self, key: str) -> None:
        pass

    def read_file(self, chain_id: str, path: str) -> bytes | None:
        self.reads.append((chain_id, path))
        return self.files.get(path)


async def test_run_as_username_and_the_images_user_are_resolved_in_the_images_files(roots) -> None:
    from client.cri.rootfs import ContainerImage

    image = ContainerImage(image_id="sha256:" + "b" * 64, name="registry.test/web:1", image_ref="registry.test/web:1",
                           chain_id="sha256:" + "c" * 64, config={"User": "web"})

    class Images:
        def container_image(self, reference: str) -> ContainerImage:
            return image

    snapshots = ImageSnapshots()
    async with pod_service(roots, images=Images(), snapshots=snapshots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        for context in ({"run_as_username": "web"}, {}):  # CRI's name, then the image's User
            cfg = node_container([BUSYBOX, "sh", "-c", "id -u; id -G"], name=f"c{os.urandom(3).hex()}")
            cfg["image"] = {"image": image.name}
            cfg["linux"]["security_context"].update(context)
            cid = await pods.create_container(pod_id, cfg)
            await pods.start_container(cid)
            await pods._task(pod_id, "Wait", {"task_id": cid}, timeout=30)
            with open(pods.container_log_path(cid)) as f:
                assert [line.rstrip("\n").split(" ", 3)[3] for line in f] == ["4321", "4322 4400"], context
    # The layers of an image never change: its files are read for its first container only.
    assert sorted(snapshots.reads) == sorted((image.chain_id, path) for path in security.USER_FILES)


# -- namespace options ---------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "mode", "target"), [
    ({}, "POD", ""), ({"pid": 1}, "CONTAINER", ""), ({"pid": 2}, "NODE", ""),
    ({"pid": 3, "target_id": "abc"}, "TARGET", "abc"), ({"pid": "TARGET", "target_id": "abc"}, "TARGET", "abc"),
])
def test_container_pid_modes_as_cri(options, mode, target) -> None:
    doc = node_container(["true"])
    doc["linux"]["security_context"]["namespace_options"] = options
    cfg = ContainerConfig.from_json(doc)
    assert (cfg.pid_mode, cfg.target_id) == (mode, target)
    assert ContainerConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("options", [{"pid": 3}, {"pid": 1, "target_id": "abc"}])
def test_a_target_id_goes_with_pid_mode_target_only(options) -> None:
    doc = node_container(["true"])
    doc["linux"]["security_context"]["namespace_options"] = options
    with pytest.raises(InvalidArgument, match="target_id"):
        ContainerConfig.from_json(doc)


async def test_a_target_container_joins_the_pid_namespace_of_its_target(roots) -> None:
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(pod_config())
        target = await pods.create_container(pod_id, node_container([BUSYBOX, "sleep", "30"], name="app", pid=1))
        await pods.start_container(target)
        cfg = node_container([BUSYBOX, "sleep", "30"], name="debug", pid=3)
        cfg["linux"]["security_context"]["namespace_options"]["target_id"] = target
        debug = await pods.create_container(pod_id, cfg)
        await pods.start_container(debug)
        pids = [(await pods.container_status(c, verbose=True))["info"]["pid"] for c in (target, debug)]
        assert os.stat(f"/proc/{pids[0]}/ns/pid").st_ino == os.stat(f"/proc/{pids[1]}/ns/pid").st_ino
        other_pod = await pods.run_pod_sandbox(pod_config())
        with pytest.raises(InvalidArgument, match="not a container of pod"):
            await pods.create_container(other_pod, cfg)


# -- the pause ------------------------------------------------------------------------------------


def test_the_pauses_confinement_as_containerds_sandbox_spec() -> None:
    sec = PodSandboxConfig.from_json(pod_config()).security
    assert security.pause_fields(sec, all_caps=ALL) == {
        "user": {"uid": 0, "gid": 0, "additional_gids": [0]}, "capabilities": list(DEFAULT_CAPABILITIES),
        "no_new_privileges": True}
    sec = security.ContainerSecurity.from_doc({"run_as_user": {"value": 65535}, "supplemental_groups": [5],
                                               "seccomp": {"profile_type": "RuntimeDefault"}})
    fields = security.pause_fields(sec, all_caps=ALL)
    assert fields["user"] == {"uid": 65535, "gid": 0, "additional_gids": [0, 5]}
    assert fields["seccomp"] == default_profile(DEFAULT_CAPABILITIES)
    privileged = security.pause_fields(security.ContainerSecurity.from_doc({"privileged": True, "seccomp": {}}),
                                       all_caps=ALL)
    assert privileged["capabilities"] == list(ALL) and "seccomp" not in privileged
    with pytest.raises(InvalidArgument, match="run_as_group"):
        security.pause_fields(security.ContainerSecurity.from_doc({"run_as_group": {"value": 1}}))


def test_a_sandbox_images_user_is_the_pauses_unless_the_pod_names_one() -> None:
    files = {"/etc/passwd": b"root:x:0:0::/:/bin/sh\npause:x:65535:65534::/:/bin/false\n",
             "/etc/group": b"root:x:0:\nnogroup:x:65534:\n"}
    sec = PodSandboxConfig.from_json(pod_config()).security
    fields = security.pause_fields(sec, all_caps=ALL, image_user="pause", read_file=files.get)
    assert fields["user"] == {"uid": 65535, "gid": 65534, "additional_gids": [65534]}
    assert security.pause_fields(sec, all_caps=ALL, image_user="1000:1000")["user"]["uid"] == 1000
    own = security.ContainerSecurity.from_doc({"run_as_user": {"value": 7}})
    assert security.pause_fields(own, all_caps=ALL, image_user="pause", read_file=files.get)["user"]["uid"] == 7
    with pytest.raises(InvalidArgument, match="'nobody' is not in the container's /etc/passwd"):
        security.pause_fields(sec, all_caps=ALL, image_user="nobody", read_file=files.get)


async def test_the_pause_runs_as_the_pods_security_context_says(handler, roots) -> None:
    cfg = pod_config()
    cfg["linux"]["security_context"].update({"run_as_user": {"value": 65535}, "run_as_group": {"value": 65534},
                                            "seccomp": {"profile_type": "RuntimeDefault"}})
    async with pod_service(roots) as pods:
        pod_id = await pods.run_pod_sandbox(cfg, runtime_handler=handler)
        pid = (await pods.pod_sandbox_status(pod_id, verbose=True))["info"]["pid"]
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        assert status["Uid"].split() == ["65535"] * 4 and status["Gid"].split() == ["65534"] * 4
        assert status["Seccomp"] == "2" and status["NoNewPrivs"] == "1"
        assert int(status["CapBnd"], 16) == caps.mask(DEFAULT_CAPABILITIES)
        # Its containers are still what their own contexts say.
        lines = await run_to_exit(pods, pod_id, [BUSYBOX, "sh", "-c", "id -u; grep Seccomp: /proc/self/status"], {})
        assert lines == ["0", "Seccomp:\t0"]
