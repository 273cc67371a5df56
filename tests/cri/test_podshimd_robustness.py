"""Nothing a client sends can crash podshimd or leave a half-made pod: configs generated at random
(odd names, hostnames, labels, sysctls, namespace modes, log directories, ports) are either run or
refused with a status the client can act on and a sentence; afterwards the daemon still serves and
no pod, sandbox bundle or network namespace is left but those it reported made."""

from __future__ import annotations

import grpc
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shim.cri.api import api_pb2

#: What a refused config may be answered with: the client's mistake, or a conflict.
CLIENT_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                 grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE}

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=80)
names = st.one_of(text, st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True))
modes = st.integers(min_value=0, max_value=3)

configs = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": names, "namespace": names, "uid": names,
                                       "attempt": st.integers(min_value=0, max_value=2**32 - 1)}),
}, optional={
    "hostname": st.one_of(names, text),
    "log_directory": st.one_of(st.just("/tmp/podshim-fuzz-logs"), text),
    "labels": st.dictionaries(names, text, max_size=3),
    "annotations": st.dictionaries(text, text, max_size=3),
    "dns_config": st.fixed_dictionaries({"servers": st.lists(text, max_size=2)}),
    "port_mappings": st.lists(st.fixed_dictionaries({
        "container_port": st.integers(min_value=-5, max_value=70000),
        "host_port": st.integers(min_value=-5, max_value=70000),
        "protocol": st.integers(min_value=0, max_value=2)}), max_size=2),
    "linux": st.fixed_dictionaries({}, optional={
        "cgroup_parent": st.one_of(st.just(""), st.just("podshim-fuzz"), text),
        "sysctls": st.dictionaries(st.sampled_from(["net.ipv4.ip_forward", "kernel.shm_rmid_forced",
                                                    "net.core.somaxconn", "vm.swappiness", "kernel.pid_max"])
                                   | text, text, max_size=2),
        "security_context": st.fixed_dictionaries({"namespace_options": st.fixed_dictionaries(
            {}, optional={"network": modes, "pid": modes, "ipc": modes})}),
    }),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(config=configs)
def test_any_pod_config_is_run_or_refused_with_a_sentence_and_nothing_is_half_made(daemon, config) -> None:
    runtime = daemon.runtime()
    request = api_pb2.RunPodSandboxRequest()
    json_format.ParseDict({"config": config}, request)
    try:
        pod_id = runtime.RunPodSandbox(request, timeout=60).pod_sandbox_id
    except grpc.RpcError as exc:
        assert exc.code() in CLIENT_ERRORS, (exc.code(), exc.details(), config)
        assert exc.details() and "Traceback" not in exc.details()
        pod_id = None
    listed = [p.id for p in runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items]
    assert listed == ([pod_id] if pod_id else [])
    if pod_id:
        runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    assert daemon.sandbox_bundles() == []
    assert daemon.process.poll() is None
