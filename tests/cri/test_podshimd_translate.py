"""podshimd's translation of the pod layer's answers into CRI messages."""

from __future__ import annotations

import time
from types import MappingProxyType
from typing import Any

import pytest
from google.protobuf import json_format

from shim.cri.api import api_pb2

from client.cri.pod import PodEntry
from client.podshimd import translate

POD: dict[str, Any] = {"id": "a" * 64, "metadata": {"name": "web", "uid": "u1", "namespace": "default", "attempt": 2},
       "state": "SANDBOX_NOTREADY", "created_at": 1_733_000_000_000_000_000, "labels": {"app": "web"},
       "annotations": {"note": "x"}, "runtime_handler": "runc", "ip": "10.88.0.2", "host_network": False}


@pytest.mark.parametrize("doc", [POD, {**POD, "metadata": {"name": "web"}, "labels": {}, "annotations": {},
                                       "runtime_handler": "", "state": "SANDBOX_READY"}], ids=["full", "sparse"])
def test_a_listed_pod_is_the_podsandbox_its_fields_say(doc) -> None:
    fields = ("id", "metadata", "state", "created_at", "labels", "annotations", "runtime_handler")
    assert translate.pod_sandbox(doc) == json_format.ParseDict({k: doc[k] for k in fields}, api_pb2.PodSandbox())


CONTAINER = {"id": "c" * 64, "pod_sandbox_id": "a" * 64, "metadata": {"name": "idle", "attempt": 3},
             "image": {"image": "10.99.0.1:5000/podshim/busybox:1.0"}, "image_ref": "sha256:" + "d" * 64,
             "image_id": "sha256:" + "d" * 64, "state": "CONTAINER_RUNNING", "created_at": 1_733_000_000_000_000_001,
             "labels": {"io.kubernetes.pod.uid": "u1", "io.kubernetes.container.name": "idle"},
             "annotations": {"io.kubernetes.container.hash": "1234"}, "exit_code": None}
CONTAINER_FIELDS = ("id", "pod_sandbox_id", "metadata", "image", "image_ref", "state", "created_at", "labels",
                    "annotations", "image_id")


def _parsed_container(doc):
    return json_format.ParseDict({k: doc[k] for k in CONTAINER_FIELDS if doc.get(k) is not None}, api_pb2.Container())


@pytest.mark.parametrize("doc", [CONTAINER, {**CONTAINER, "metadata": {"name": "idle"}, "labels": {}, "annotations": {},
                                             "image_id": None, "image_ref": "", "state": "CONTAINER_EXITED",
                                             "exit_code": 2}], ids=["full", "sparse"])
def test_a_listed_container_is_the_container_its_fields_say(doc) -> None:
    assert translate.container(doc) == _parsed_container(doc)


def test_a_listed_container_costs_a_fraction_of_protobufs_json_reflection() -> None:
    # kubelet lists every container each second: a hundred pods' listing must not cost what
    # json_format's reflection costs per message.
    def cost(make) -> float:
        started = time.perf_counter()
        for _ in range(200):
            make(CONTAINER)
        return time.perf_counter() - started

    ratios = [cost(translate.container) / cost(_parsed_container) for _ in range(5)]
    assert min(ratios) < 0.25, f"{min(ratios):.2f} of json_format's cost"


def _entry(n: int, **changes):
    """A read-only entry, as the pod layer lists them."""
    doc = {**POD, "id": f"{n:064x}", "metadata": {**POD["metadata"], "name": f"web-{n}"},
           "created_at": POD["created_at"] - n, "labels": {"app": "web", "n": str(n)}, **changes}
    return PodEntry({k: MappingProxyType(v) if isinstance(v, dict) else v for k, v in doc.items()})


@pytest.fixture
def encoded(monkeypatch):
    """The ids of the pods encoded into PodSandboxes from now on, in order."""
    ids: list[str] = []
    real = translate.pod_sandbox
    monkeypatch.setattr(translate, "pod_sandbox", lambda doc: ids.append(doc["id"]) or real(doc))
    return ids


def _expected(docs, pod_sandbox=translate.pod_sandbox):  # the real one, not the fixture's recorder
    return api_pb2.ListPodSandboxResponse(items=[pod_sandbox(doc) for doc in docs])


def test_a_listing_is_its_entries_podsandboxes_in_order() -> None:
    docs = [_entry(n) for n in range(3)] + [_entry(3, labels={}, annotations={}, metadata={"name": "bare"})]
    listed = translate.PodSandboxes()
    assert listed.response(docs) == _expected(docs)
    assert listed.response(docs[::-1]) == _expected(docs[::-1])
    assert listed.response([]) == api_pb2.ListPodSandboxResponse()


def test_a_listing_shows_a_pod_that_changed_as_a_new_entry() -> None:
    listed = translate.PodSandboxes()
    listed.response([_entry(1), _entry(2)])
    now = [_entry(1, state="SANDBOX_READY"), _entry(2, labels={"app": "db"}, runtime_handler="crun")]
    assert listed.response(now) == _expected(now)


def test_a_read_only_entry_listed_again_is_not_encoded_again(encoded) -> None:
    listed = translate.PodSandboxes()
    docs = [_entry(1), _entry(2)]
    expected = _expected(docs)
    listed.response(docs)
    assert listed.response(docs) == expected
    assert encoded == [docs[0]["id"], docs[1]["id"]]


def test_a_read_only_entry_in_another_listing_is_not_encoded_again(encoded) -> None:
    listed = translate.PodSandboxes()
    a, b, c = _entry(1), _entry(2), _entry(3)
    listed.response([a, b])
    assert listed.response([b]) == _expected([b])  # not the last listing: each pod's own encoding
    assert listed.response([c, a]) == _expected([c, a])
    assert encoded == [a["id"], b["id"], c["id"]]


def test_a_mapping_the_pod_layer_did_not_make_is_encoded_each_time(encoded) -> None:
    listed = translate.PodSandboxes()
    doc = MappingProxyType(dict(_entry(1)))  # read-only too, but not the pod layer's mark
    listed.response([doc])
    assert listed.response([_entry(2), doc]) == _expected([_entry(2), doc])
    assert encoded == [doc["id"], _entry(2)["id"], doc["id"]]


def test_a_listing_shows_a_changeable_entry_as_it_is_now() -> None:
    listed = translate.PodSandboxes()
    doc = {**_entry(1), "labels": {"app": "web"}, "metadata": {"name": "web", "attempt": 1}}
    listed.response([doc])
    doc["labels"]["app"] = "db"
    doc["metadata"]["attempt"] = 7
    assert listed.response([doc]) == _expected([doc])


def test_a_listing_keeps_the_encodings_of_the_last_pods_only(encoded) -> None:
    listed = translate.PodSandboxes(kept=2)
    docs = [_entry(n) for n in range(3)]
    assert listed.response(docs) == _expected(docs)
    assert listed.response(docs) == _expected(docs)  # the last listing again: its bytes
    assert listed.response(docs[2:]) == _expected(docs[2:])  # kept
    assert listed.response(docs[:1]) == _expected(docs[:1])  # pushed out by the two after it
    assert listed.response(docs[1:2]) == _expected(docs[1:2])  # pushed out by docs[0]'s return
    assert encoded == [docs[0]["id"], docs[1]["id"], docs[2]["id"], docs[0]["id"], docs[1]["id"]]



# -- statuses -------------------------------------------------------------------------------------


def _container_status_doc(**changes: Any) -> dict[str, Any]:
    return {"id": "c" * 64, "metadata": {"name": "idle", "attempt": 0}, "state": "CONTAINER_RUNNING",
            "created_at": 1, "started_at": 2, "image": {"image": "busybox"}, "image_ref": "sha256:" + "b" * 64,
            "labels": {"app": "x"}, "annotations": {}, "log_path": "/l/0.log", **changes}


def test_a_status_asked_again_unchanged_is_not_parsed_again_and_a_changed_one_is(monkeypatch) -> None:
    parsed: list[str] = []
    parse = json_format.ParseDict

    def counted(js: dict[str, Any], message: Any) -> Any:
        parsed.append(js["id"])
        return parse(js, message)

    monkeypatch.setattr(json_format, "ParseDict", counted)
    doc = _container_status_doc(id="s" * 64)
    first = translate.container_status(doc)
    again = translate.container_status(dict(doc))
    assert again == first and again is not first and parsed == ["s" * 64]
    exited = translate.container_status({**doc, "state": "CONTAINER_EXITED", "finished_at": 3, "exit_code": 7})
    assert (exited.state, exited.finished_at, exited.exit_code) == (api_pb2.CONTAINER_EXITED, 3, 7)
    assert parsed == ["s" * 64] * 2
    # Another object with the same fields is its own entry, and says its own id.
    other = translate.container_status({**doc, "id": "t" * 64})
    assert other.id == "t" * 64
