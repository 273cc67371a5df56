"""podshimd's translation of the pod layer's answers into CRI messages."""

from __future__ import annotations

from types import MappingProxyType

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


def _entry(n: int, **changes):
    """A read-only entry, as the pod layer lists them."""
    doc = {**POD, "id": f"{n:064x}", "metadata": {**POD["metadata"], "name": f"web-{n}"},
           "created_at": POD["created_at"] - n, "labels": {"app": "web", "n": str(n)}, **changes}
    return MappingProxyType({k: MappingProxyType(v) if isinstance(v, dict) else v for k, v in doc.items()})


def _expected(docs):
    return api_pb2.ListPodSandboxResponse(items=[translate.pod_sandbox(doc) for doc in docs])


def test_a_listing_is_its_entries_podsandboxes_in_order():
    docs = [_entry(n) for n in range(3)] + [_entry(3, labels={}, annotations={}, metadata={"name": "bare"})]
    listed = translate.PodSandboxes()
    assert listed.response(docs) == _expected(docs)
    assert listed.response(docs[::-1]) == _expected(docs[::-1])
    assert listed.response([]) == api_pb2.ListPodSandboxResponse()


def test_a_listing_shows_a_pod_that_changed_as_a_new_entry():
    listed = translate.PodSandboxes()
    listed.response([_entry(1), _entry(2)])
    now = [_entry(1, state="SANDBOX_READY"), _entry(2, labels={"app": "db"}, runtime_handler="crun")]
    assert listed.response(now) == _expected(now)


def test_a_read_only_entry_listed_again_is_not_encoded_again(monkeypatch):
    listed = translate.PodSandboxes()
    docs = [_entry(1), _entry(2)]
    expected = _expected(docs)
    encoded = []
    real = translate.pod_sandbox
    monkeypatch.setattr(translate, "pod_sandbox", lambda doc: encoded.append(doc["id"]) or real(doc))
    listed.response(docs)
    assert listed.response(docs) == expected
    assert encoded == [docs[0]["id"], docs[1]["id"]]


def test_a_listing_shows_a_changeable_entry_as_it_is_now():
    listed = translate.PodSandboxes()
    doc = {**_entry(1), "labels": {"app": "web"}, "metadata": {"name": "web", "attempt": 1}}
    listed.response([doc])
    doc["labels"]["app"] = "db"
    doc["metadata"]["attempt"] = 7
    assert listed.response([doc]) == _expected([doc])


def test_a_listing_keeps_the_encodings_of_the_last_pods_only():
    listed = translate.PodSandboxes(kept=2)
    docs = [_entry(n) for n in range(5)]
    assert listed.response(docs) == _expected(docs)
    assert listed.response(docs) == _expected(docs)
    assert len(listed._encoded) == 2
