"""The Controller's shim handle: its phases move only as client.controller.handle.TRANSITIONS allows."""

from __future__ import annotations

import itertools

import pytest

from shim.rpc.status import FailedPrecondition

from client.controller.handle import TRANSITIONS, Phase, ShimHandle


def handle_in(phase: Phase, tmp_path) -> ShimHandle:
    """A handle brought to ``phase`` along allowed moves (breadth-first from PENDING)."""
    paths: dict[Phase, list[Phase]] = {Phase.PENDING: []}
    frontier = [Phase.PENDING]
    while frontier:
        here = frontier.pop(0)
        for there in sorted(TRANSITIONS[here], key=lambda p: p.value):
            if there not in paths:
                paths[there] = paths[here] + [there]
                frontier.append(there)
    handle = ShimHandle("ns1", "sb1", str(tmp_path / "ns1" / "sb1"))
    for step in paths[phase]:
        handle.move(step)
    return handle


def test_every_phase_has_a_row_and_gone_is_the_end() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert TRANSITIONS[Phase.GONE] == frozenset()
    assert all(Phase.PENDING not in targets for targets in TRANSITIONS.values())  # nothing goes back


@pytest.mark.parametrize("start, target", [
    (a, b) for a, b in itertools.product(Phase, Phase) if b in TRANSITIONS[a]])
def test_an_allowed_move_changes_the_phase(tmp_path, start, target) -> None:
    handle = handle_in(start, tmp_path)
    handle.move(target)
    assert handle.phase is target and handle.settled.is_set()


@pytest.mark.parametrize("start, target", [
    (a, b) for a, b in itertools.product(Phase, Phase) if b not in TRANSITIONS[a]])
def test_a_move_the_table_does_not_list_is_a_failed_precondition_that_says_why(tmp_path, start, target) -> None:
    handle = handle_in(start, tmp_path)
    with pytest.raises(FailedPrecondition, match=rf"sandbox sb1 in namespace ns1 .+; it cannot become {target.value}$"):
        handle.move(target)
    assert handle.phase is start


def test_a_pending_handle_is_not_settled_until_it_moves(tmp_path) -> None:
    handle = ShimHandle("ns1", "sb1", str(tmp_path / "ns1" / "sb1"))
    assert handle.phase is Phase.PENDING and not handle.settled.is_set()
