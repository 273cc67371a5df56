"""Task.Create's process confinement (protocol.md 7.3: ``user``, ``capabilities``, ``rlimits``,
``no_new_privileges``, ``seccomp``), applied by every runtime handler and checked in the
kernel's own words: /proc/PID/status, and what a probe in the task may or may not do."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import subprocess

import pytest

from shim.api.defaults import DEFAULT_CAPABILITIES
from shim.kernel import capabilities as caps
from shim.kernel import seccomp
from shim.rpc import FailedPrecondition, InvalidArgument, NotFound
from shim.runtime import confine

from support.shimtools import (
    Shim,
    ShimLauncher,
    host_untouched,  # noqa: F401  (autouse: what this module's shims made is checked at the end)
)

BUSYBOX = "/bin/busybox"
DEFAULT_MASK = caps.mask(DEFAULT_CAPABILITIES)


def handler_installed(name: str) -> str:
    if name != "native" and shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin") is None:
        pytest.skip(f"{name} is not installed")
    return name


@pytest.fixture(params=["native", "runc", "crun"])
def handler(request) -> str:
    return handler_installed(request.param)


class Pod:
    """A running sandbox and its tasks' log files."""

    def __init__(self, shim: Shim, log_dir: str):
        self.shim = shim
        self.log_dir = log_dir
        self.call = shim.task  # a Task method for this sandbox

    async def create(self, task_id: str, *args: str, **fields) -> None:
        await self.call("Create", task_id=task_id, args=list(args), log_path=self.log_path(task_id), **fields)

    async def start(self, task_id: str, *args: str, **fields) -> int:
        await self.create(task_id, *args, **fields)
        return (await self.call("Start", task_id=task_id))["pid"]

    async def output(self, task_id: str, script: str, **fields) -> list[str]:
        """Run ``busybox sh -c script`` to its end; its stdout and stderr lines."""
        await self.start(task_id, BUSYBOX, "sh", "-c", script, **fields)
        await self.call("Wait", task_id=task_id)
        with open(self.log_path(task_id)) as f:
            return [line.rstrip("\n").split(" ", 3)[3] for line in f]

    def log_path(self, task_id: str) -> str:
        return os.path.join(self.log_dir, f"{task_id}.log")


@pytest.fixture
async def pod(shims: ShimLauncher, handler: str, tmp_path) -> Pod:
    shim = await shims.start()
    await shim.run_sandbox(options={"runtime_handler": handler})
    return Pod(shim, str(tmp_path))


async def status(pod: Pod, **fields) -> dict[str, str]:
    """/proc/PID/status of a task that prints its own (``busybox cat`` is the task's process:
    read after its exit, so an OCI runtime's init that has not exec'd yet is never read)."""
    lines = await pod.output("status", "exec cat /proc/self/status", **fields)
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def cap_field(fields: dict[str, str], name: str) -> int:
    return int(fields[name], 16)


# -- /proc/PID/status for each setting --------------------------------------------------------


async def test_a_task_without_the_fields_gets_the_default_capabilities_as_root(pod) -> None:
    fields = await status(pod)
    for name in ("CapEff", "CapPrm", "CapBnd"):
        assert cap_field(fields, name) == DEFAULT_MASK, (name, caps.names(cap_field(fields, name)))
    assert cap_field(fields, "CapInh") == 0 and cap_field(fields, "CapAmb") == 0
    assert fields["Uid"].split() == ["0"] * 4 and fields["Gid"].split() == ["0"] * 4
    assert fields["NoNewPrivs"] == "0" and fields["Seccomp"] == "0"


async def test_capabilities_set_bounding_effective_and_permitted(pod) -> None:
    wanted = ["CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_KILL"]
    fields = await status(pod, capabilities=wanted)
    for name in ("CapEff", "CapPrm", "CapBnd"):
        assert cap_field(fields, name) == caps.mask(wanted), name


async def test_an_empty_capability_list_leaves_none(pod) -> None:
    fields = await status(pod, capabilities=[])
    assert [cap_field(fields, n) for n in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb")] == [0] * 5


async def test_user_sets_uids_gids_and_groups_and_a_non_root_user_keeps_only_the_bounding_set(pod) -> None:
    user = {"uid": 1000, "gid": 2000, "additional_gids": [3000, 3001]}
    fields = await status(pod, user=user)
    assert fields["Uid"].split() == ["1000"] * 4
    assert fields["Gid"].split() == ["2000"] * 4
    assert fields["Groups"].split() == ["3000", "3001"]
    # As with containerd: no ambient capabilities, so a non-root process execs with none.
    assert cap_field(fields, "CapEff") == 0 and cap_field(fields, "CapPrm") == 0
    assert cap_field(fields, "CapBnd") == DEFAULT_MASK


async def test_no_new_privileges_is_set(pod) -> None:
    fields = await status(pod, no_new_privileges=True)
    assert fields["NoNewPrivs"] == "1"


@pytest.mark.parametrize("no_new_privileges", [True, False])
async def test_a_seccomp_profile_filters_the_task(pod, no_new_privileges) -> None:
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86"],
               "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}
    fields = await status(pod, seccomp=profile, no_new_privileges=no_new_privileges, user={"uid": 1000, "gid": 1000})
    assert fields["Seccomp"] == "2" and fields["NoNewPrivs"] == str(int(no_new_privileges))
    lines = await pod.output("probe", "mkdir /dev/shm/probe; echo rc=$?", seccomp=profile,
                             no_new_privileges=no_new_privileges)
    assert "rc=1" in lines and any("Operation not permitted" in line for line in lines), lines
    lines = await pod.output("control", "mkdir /dev/shm/control && echo rc=$?")
    assert lines == ["rc=0"]


async def test_a_seccomp_rule_with_errno_ret_and_argument_comparisons(pod) -> None:
    # kill(pid, 0) is denied with ENOSYS; kill(pid, SIGCONT) is not.
    profile = {"defaultAction": "SCMP_ACT_ALLOW",
               "syscalls": [{"names": ["kill"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS,
                             "args": [{"index": 1, "value": 0, "op": "SCMP_CMP_EQ"}]}]}
    lines = await pod.output("probe", "kill -0 $$; echo zero=$?; kill -CONT $$; echo cont=$?",
                             seccomp=profile, no_new_privileges=True)
    assert "zero=1" in lines and "cont=0" in lines, lines
    assert any("Function not implemented" in line for line in lines), lines


# -- what an unprivileged task cannot do ------------------------------------------------------


async def test_a_task_with_the_default_capabilities_cannot_mount_or_unload_modules(pod) -> None:
    lines = await pod.output("probe", "mount -t tmpfs none /dev/shm; echo mount=$?; "
                                      "rmmod podshim_no_such_module; echo rmmod=$?; grep CapBnd /proc/self/status")
    assert "mount=1" in lines and "rmmod=1" in lines, lines
    assert any(line.startswith("mount: permission denied") for line in lines), lines
    # (this kernel may have no module support at all: rmmod then fails with ENOSYS, not EPERM)
    bounding = int(next(line for line in lines if line.startswith("CapBnd:")).split()[1], 16)
    assert not bounding & caps.mask(["CAP_SYS_MODULE", "CAP_SYS_ADMIN"])


async def test_a_task_cannot_write_proc_sys(pod) -> None:
    with open("/proc/sys/vm/overcommit_ratio") as f:
        value = f.read().strip()  # written back unchanged, should the write ever get through
    lines = await pod.output("probe", f"echo {value} > /proc/sys/vm/overcommit_ratio; echo rc=$?")
    assert "rc=1" in lines and any("Read-only file system" in line for line in lines), lines


# -- Create refuses what cannot be applied ----------------------------------------------------


@pytest.mark.parametrize(("fields", "words"), [
    ({"capabilities": ["CAP_NO_SUCH"]}, "CAP_NO_SUCH"),
    ({"capabilities": "CAP_KILL"}, "'capabilities'"),
    ({"user": {"uid": -1}}, "'user.uid'"),
    ({"user": {"uid": 0, "name": "root"}}, "'user.name'"),
    ({"user": {"additional_gids": ["wheel"]}}, "'user.additional_gids'"),
    ({"no_new_privileges": 1}, "'no_new_privileges'"),
    ({"seccomp": {"defaultAction": "SCMP_ACT_PANIC"}}, "defaultAction"),
    ({"seccomp": {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}]}},
     "SCMP_ACT_NOTIFY"),
    ({"seccomp": {"defaultAction": "SCMP_ACT_ALLOW",
                  "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO",
                                "args": [{"index": 6, "value": 1, "op": "SCMP_CMP_EQ"}]}]}}, r"args\[0\]\.index"),
    ({"seccomp": {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_VAX"]}}, "SCMP_ARCH_VAX"),
])
async def test_create_refuses_a_field_it_cannot_apply_naming_it(pod, fields, words) -> None:
    with pytest.raises(InvalidArgument, match=words):
        await pod.create("app", BUSYBOX, "true", **fields)


def test_a_capability_the_shim_does_not_hold_is_refused() -> None:
    missing = caps.mask(list(caps.CAPABILITIES)) & ~caps.current("CapPrm") & ((1 << (caps.last_cap() + 1)) - 1)
    if not missing:
        pytest.skip("this machine's bounding set has every capability")
    name = caps.names(missing)[0]
    with pytest.raises(InvalidArgument, match=name):
        confine.from_request({"capabilities": [name]})


def test_unknown_syscall_names_are_skipped_as_runc_does() -> None:
    profile = {"defaultAction": "SCMP_ACT_ERRNO",
               "syscalls": [{"names": ["read", "podshim_no_such_syscall"], "action": "SCMP_ACT_ALLOW"}]}
    seccomp.validate(profile)
    assert len(seccomp.compile_profile(profile)) % 8 == 0


# -- sysctls: only namespaced ones, for every handler ------------------------------------------


async def test_a_sysctl_that_is_not_namespaced_is_refused_and_the_host_value_stays(shims: ShimLauncher, handler) -> None:
    with open("/proc/sys/vm/overcommit_ratio") as f:
        before = f.read()
    shim = await shims.start()
    with pytest.raises(InvalidArgument, match="not namespaced"):
        await shim.run_sandbox(options={"runtime_handler": handler,
                                        "linux": {"sysctls": {"vm.overcommit_ratio": str(int(before) + 1)}}})
    with open("/proc/sys/vm/overcommit_ratio") as f:
        assert f.read() == before


async def test_uts_and_ipc_sysctls_are_set_in_the_pods_namespaces_only(shims: ShimLauncher, handler, tmp_path) -> None:
    with open("/proc/sys/kernel/domainname") as f:
        host_domain = f.read()
    shim = await shims.start()
    await shim.run_sandbox(options={"runtime_handler": handler, "linux": {
        "sysctls": {"kernel.domainname": "pods.example", "kernel.msgmax": "12345"}}})
    pod = Pod(shim, str(tmp_path))
    lines = await pod.output("probe", "cat /proc/sys/kernel/domainname /proc/sys/kernel/msgmax")
    assert lines == ["pods.example", "12345"]
    with open("/proc/sys/kernel/domainname") as f:
        assert f.read() == host_domain


def test_a_uts_sysctl_with_host_network_is_refused() -> None:
    from shim.runtime import pause
    with pytest.raises(InvalidArgument, match="host network"):
        pause.validate_sysctls({"kernel.domainname": "x"}, host_network=True, host_ipc=False)


# -- pid namespace modes: NODE and TARGET ------------------------------------------------------


def pid_ns(pid: int | str) -> int:
    return os.stat(f"/proc/{pid}/ns/pid").st_ino


async def test_node_pid_mode_stays_in_the_hosts_pid_namespace(pod) -> None:
    pid = await pod.start("app", BUSYBOX, "sleep", "30", pid_mode="NODE")
    assert pid_ns(pid) == pid_ns("self")


async def test_target_pid_mode_joins_the_pid_namespace_of_another_task(pod) -> None:
    target = await pod.start("target", BUSYBOX, "sleep", "30", pid_mode="CONTAINER")
    lines = await pod.output("debug", "tr '\\0' ' ' < /proc/1/cmdline; echo", pid_mode="TARGET", pid_target="target")
    assert lines == ["/bin/busybox sleep 30 "]  # the target is PID 1 of the namespace it joined
    joined = await pod.start("joined", BUSYBOX, "sleep", "30", pid_mode=3, pid_target="target")
    assert pid_ns(joined) == pid_ns(target) != pid_ns("self")


async def test_target_pid_mode_needs_a_running_task_of_the_sandbox(pod) -> None:
    with pytest.raises(InvalidArgument, match="pid_target"):
        await pod.create("a", BUSYBOX, "true", pid_mode="TARGET")
    with pytest.raises(InvalidArgument, match="pid_target"):
        await pod.create("b", BUSYBOX, "true", pid_mode="POD", pid_target="x")
    with pytest.raises(NotFound, match="pid_target"):
        await pod.create("c", BUSYBOX, "true", pid_mode="TARGET", pid_target="nobody")
    await pod.create("idle", BUSYBOX, "true")
    await pod.create("d", BUSYBOX, "true", pid_mode="TARGET", pid_target="idle")
    with pytest.raises(FailedPrecondition, match="not running"):
        await pod.call("Start", task_id="d")


async def test_an_exec_is_confined_as_its_task(pod) -> None:
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}
    await pod.start("app", BUSYBOX, "sleep", "30", user={"uid": 1000, "gid": 1000}, capabilities=["CAP_KILL"],
                    no_new_privileges=True, seccomp=profile)
    result = await pod.call("Exec", task_id="app", args=[BUSYBOX, "cat", "/proc/self/status"])
    fields = dict(line.split(":\t", 1) for line in result["stdout"].decode().splitlines() if ":\t" in line)
    assert fields["Uid"].split() == ["1000"] * 4 and fields["Seccomp"] == "2" and fields["NoNewPrivs"] == "1"
    assert cap_field(fields, "CapBnd") == caps.mask(["CAP_KILL"])


async def test_a_profile_with_filter_flags_is_loaded_with_them_or_refused_by_a_runtime_without_them(pod, handler) -> None:
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_LOG", "SECCOMP_FILTER_FLAG_SPEC_ALLOW"],
               "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}
    if handler == "runc" and subprocess.run(["runc", "--version"], capture_output=True, text=True).stdout.startswith(
            "runc version 1.1."):
        with pytest.raises(InvalidArgument, match="runc does not support the filter flag"):  # it says so itself
            await pod.create("probe", BUSYBOX, "true", seccomp=profile)
        return
    lines = await pod.output("probe", "mkdir /dev/shm/d; echo rc=$?; grep Seccomp: /proc/self/status",
                             seccomp=profile, no_new_privileges=True)
    assert "rc=1" in lines and "Seccomp:\t2" in lines, lines


async def test_a_pause_confinement_the_runtime_cannot_apply_is_refused_at_create_sandbox(shims: ShimLauncher) -> None:
    if subprocess.run(["runc", "--version"], capture_output=True, text=True).stdout[:16] != "runc version 1.1":
        pytest.skip("this runc may apply seccomp filter flags")
    shim = await shims.start()
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_LOG"]}
    with pytest.raises(InvalidArgument, match="linux.pause_process: field 'seccomp'"):
        await shim.call("CreateSandbox", options={"runtime_handler": "runc",
                                                  "linux": {"pause_process": {"seccomp": profile}}})
    with pytest.raises(InvalidArgument, match="linux.pause_process: field 'capabilities'"):
        await shim.call("CreateSandbox", options={"linux": {"pause_process": {"capabilities": ["CAP_NOPE"]}}})


# -- a privileged pod's devices ------------------------------------------------------------------

#: Host devices outside every runtime's default device rules (runc's: null, zero, full, tty,
#: random, urandom, console, ptmx, pts, fuse, net/tun), which a privileged task must be able to open.
EXTRA_DEVICES = [path for path in ("/dev/loop-control", "/dev/kmsg") if os.path.exists(path)]


async def test_a_privileged_task_of_a_privileged_pod_opens_the_hosts_devices(shims: ShimLauncher, handler, tmp_path) -> None:
    if not EXTRA_DEVICES:
        pytest.skip("the host has neither /dev/loop-control nor /dev/kmsg")
    shim = await shims.start()
    every_capability = caps.names(caps.current())
    await shim.run_sandbox(options={"runtime_handler": handler, "linux": {
        "security_context": {"privileged": True}, "pause_process": {"capabilities": every_capability}}})
    pod = Pod(shim, str(tmp_path))
    lines = await pod.output("probe", "for d in " + " ".join(EXTRA_DEVICES) + "; do "
                             "(: < $d) && echo opened $d; done 2>&1", privileged=True, capabilities=every_capability)
    assert lines == [f"opened {path}" for path in EXTRA_DEVICES]


@pytest.mark.cgroupv2
async def test_on_cgroup_v2_a_task_of_a_privileged_pod_that_is_not_privileged_keeps_the_default_device_rules(
        shims: ShimLauncher, handler, tmp_path) -> None:
    # The pod's cgroup allows every device; the task's own program (the shim's, or runc's and
    # crun's, which the kernel refused beside one of the shim's) allows making any node but
    # opening only the default devices: /dev/kmsg (1:11) is not one of them.
    shim = await shims.start()
    await shim.run_sandbox(options={"runtime_handler": handler, "linux": {"security_context": {"privileged": True}}})
    pod = Pod(shim, str(tmp_path))
    lines = await pod.output("probe", "mknod /dev/probe c 1 11 && echo made && echo x > /dev/probe; echo rc=$?")
    assert sorted(lines) == ["made", "rc=1", "sh: can't create /dev/probe: Operation not permitted"]  # two pipes
    privileged = await pod.output("privileged", "echo x > /dev/kmsg; echo rc=$?", privileged=True,
                                  capabilities=caps.names(caps.current()))
    assert privileged == ["rc=0"]


# -- rlimits: set on the task and its execs, for every handler -----------------------------------

UNLIMITED = 2**64 - 1
LIMIT_NAMES = {"RLIMIT_NOFILE": "Max open files", "RLIMIT_CORE": "Max core file size"}


def limits(text: str) -> dict[str, tuple[str, str]]:
    """/proc/PID/limits: limit name -> (soft, hard) in its own words ("unlimited" or a number)."""
    return {line[:26].strip(): tuple(line[26:].split()[:2]) for line in text.splitlines()[1:]}  # type: ignore[misc]


def shown(soft: int, hard: int) -> tuple[str, str]:
    return tuple("unlimited" if v == UNLIMITED else str(v) for v in (soft, hard))  # type: ignore[return-value]


async def test_rlimits_are_set_on_the_task_and_on_its_execs_which_may_say_their_own(pod, handler) -> None:
    own_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    wanted = [{"type": "RLIMIT_NOFILE", "soft": 256, "hard": 1024}, {"type": "RLIMIT_CORE", "soft": 4096, "hard": 8192}]
    pid = await pod.start("app", BUSYBOX, "sleep", "30", rlimits=wanted)
    with open(f"/proc/{pid}/limits") as f:
        task = limits(f.read())
    assert task[LIMIT_NAMES["RLIMIT_NOFILE"]] == shown(256, 1024) != shown(own_nofile, own_nofile)
    assert task[LIMIT_NAMES["RLIMIT_CORE"]] == shown(4096, 8192)
    read_limits = [BUSYBOX, "cat", "/proc/self/limits"]
    if handler == "runc":  # its exec may raise a soft RLIMIT_NOFILE to the hard one: refused, not wrong
        with pytest.raises(FailedPrecondition, match="RLIMIT_NOFILE soft limit 256 below its hard limit 1024"):
            await pod.call("Exec", task_id="app", args=read_limits)
    else:
        exec_ = limits((await pod.call("Exec", task_id="app", args=read_limits))["stdout"].decode())
        assert exec_[LIMIT_NAMES["RLIMIT_NOFILE"]] == shown(256, 1024)
        assert exec_[LIMIT_NAMES["RLIMIT_CORE"]] == shown(4096, 8192)
    own = [{"type": "RLIMIT_NOFILE", "soft": 128, "hard": 128}, {"type": "RLIMIT_CORE", "soft": 0, "hard": 16}]
    result = limits((await pod.call("Exec", task_id="app", args=read_limits, rlimits=own))["stdout"].decode())
    assert result[LIMIT_NAMES["RLIMIT_NOFILE"]] == shown(128, 128)
    assert result[LIMIT_NAMES["RLIMIT_CORE"]] == shown(0, 16)


@pytest.mark.parametrize(("rlimits", "words"), [
    ([{"type": "RLIMIT_NOSUCH", "soft": 1, "hard": 1}], r"'rlimits\[0\]\.type' must be one of"),
    ([{"type": "RLIMIT_NOFILE", "soft": 2048, "hard": 1024}], "soft limit 2048 is above its hard limit 1024"),
    ([{"type": "RLIMIT_CORE", "soft": 0, "hard": 0}, {"type": "RLIMIT_CORE", "soft": 1, "hard": 1}],
     "RLIMIT_CORE is given twice"),
    ([{"type": "RLIMIT_NOFILE", "soft": -1, "hard": 1024}], r"'rlimits\[0\]\.soft' must be an integer"),
    ({"RLIMIT_NOFILE": 1024}, "'rlimits' must be an array"),
])
async def test_a_malformed_rlimit_is_refused_naming_it(pod, rlimits, words) -> None:
    with pytest.raises(InvalidArgument, match=words):
        await pod.create("app", BUSYBOX, "true", rlimits=rlimits)


async def test_a_hard_limit_above_the_shims_own_is_refused_not_lowered(pod) -> None:
    if caps.current("CapEff") & caps.mask(["CAP_SYS_RESOURCE"]):
        pytest.skip("the shim may raise its hard limits here (it holds CAP_SYS_RESOURCE)")
    own = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # the shim's: it inherits the test's
    with pytest.raises(FailedPrecondition, match=f"RLIMIT_NOFILE's hard limit {own + 1} cannot be given"):
        await pod.create("app", BUSYBOX, "true", rlimits=[{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": own + 1}])
    await pod.start("app", BUSYBOX, "sleep", "30")
    with pytest.raises(FailedPrecondition, match="RLIMIT_NOFILE's hard limit"):
        await pod.call("Exec", task_id="app", args=[BUSYBOX, "true"],
                       rlimits=[{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": own + 1}])
