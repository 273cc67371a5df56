"""podshimd's translation of the pod layer's answers into CRI messages."""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from client.criapi import api_pb2
from client.podshimd import translate

POD = {"id": "a" * 64, "metadata": {"name": "web", "uid": "u1", "namespace": "default", "attempt": 2},
       "state": "SANDBOX_NOTREADY", "created_at": 1_733_000_000_000_000_000, "labels": {"app": "web"},
       "annotations": {"note": "x"}, "runtime_handler": "runc", "ip": "10.88.0.2", "host_network": False}


@pytest.mark.parametrize("doc", [POD, {**POD, "metadata": {"name": "web"}, "labels": {}, "annotations": {},
                                       "runtime_handler": "", "state": "SANDBOX_READY"}], ids=["full", "sparse"])
def test_a_listed_pod_is_the_podsandbox_its_fields_say(doc):
    fields = ("id", "metadata", "state", "created_at", "labels", "annotations", "runtime_handler")
    assert translate.pod_sandbox(doc) == json_format.ParseDict({k: doc[k] for k in fields}, api_pb2.PodSandbox())
