"""The sandbox's and the tasks' state machines as tables: every allowed transition, and every
refused one with its error and its sentence. Pure functions: no shim, no kernel, no root."""

from __future__ import annotations

import itertools

import pytest

from shim.rpc.status import AlreadyExists, FailedPrecondition, NotFound, Unavailable
from shim.sandbox import sandbox, tasks
from shim.sandbox.sandbox import Operation as Op
from shim.sandbox.sandbox import State as S
from shim.sandbox.tasks import Status as T
from shim.sandbox.tasks import TaskOperation as TOp

# -- the sandbox ------------------------------------------------------------------------------

SANDBOX_ALLOWED = [
    (Op.CREATE, S.NEW, S.CREATED),
    (Op.START, S.CREATED, S.RUNNING),
    (Op.STOP, S.CREATED, S.STOPPED),
    (Op.STOP, S.RUNNING, S.STOPPED),
    (Op.STOP, S.STOPPED, S.STOPPED),
    (Op.EXIT, S.RUNNING, S.STOPPED),
    (Op.UPDATE, S.RUNNING, S.RUNNING),  # a pod's resources: its cgroup holds what runs
    (Op.SHUTDOWN, S.NEW, S.SHUTDOWN),
    (Op.SHUTDOWN, S.CREATED, S.SHUTDOWN),
    (Op.SHUTDOWN, S.RUNNING, S.SHUTDOWN),
    (Op.SHUTDOWN, S.STOPPED, S.SHUTDOWN),
    *((op, state, state) for op in (Op.WAIT, Op.STATUS, Op.METRICS, Op.PLATFORM)
      for state in (S.CREATED, S.RUNNING, S.STOPPED)),
]
SANDBOX_REFUSED = [
    *((op, S.NEW, NotFound, "sandbox sb1 has not been created in this shim")
      for op in (Op.START, Op.STOP, Op.EXIT, Op.WAIT, Op.STATUS, Op.METRICS, Op.PLATFORM, Op.UPDATE)),
    *((op, S.SHUTDOWN, Unavailable, "sandbox sb1 was shut down; the shim is exiting") for op in Op),
    (Op.CREATE, S.CREATED, AlreadyExists, "sandbox sb1 already exists (it is created)"),
    (Op.CREATE, S.RUNNING, AlreadyExists, "sandbox sb1 already exists (it is running)"),
    (Op.CREATE, S.STOPPED, AlreadyExists, "sandbox sb1 already exists (it is stopped)"),
    (Op.START, S.RUNNING, FailedPrecondition, "sandbox sb1 is already running"),
    (Op.START, S.STOPPED, FailedPrecondition, "sandbox sb1 has stopped; a stopped sandbox cannot be started again"),
    (Op.EXIT, S.CREATED, FailedPrecondition, "cannot exit sandbox sb1 while it is created"),
    (Op.EXIT, S.STOPPED, FailedPrecondition, "cannot exit sandbox sb1 while it is stopped"),
    (Op.UPDATE, S.CREATED, FailedPrecondition, "cannot update sandbox sb1 while it is created"),
    (Op.UPDATE, S.STOPPED, FailedPrecondition, "cannot update sandbox sb1 while it is stopped"),
]


def test_every_sandbox_operation_in_every_state_is_either_allowed_or_refused_here() -> None:
    specified = [(op, state) for op, state, _ in SANDBOX_ALLOWED] + [(op, state) for op, state, *_ in SANDBOX_REFUSED]
    assert sorted(specified) == sorted(itertools.product(Op, S))


@pytest.mark.parametrize("op, state, after", SANDBOX_ALLOWED)
def test_an_allowed_sandbox_transition_gives_the_next_state(op, state, after) -> None:
    assert sandbox.transition(op, state, "sb1") is after
    assert sandbox.TRANSITIONS[(op, state)] is after


@pytest.mark.parametrize("op, state, error, sentence", SANDBOX_REFUSED)
def test_a_refused_sandbox_transition_says_why(op, state, error, sentence) -> None:
    with pytest.raises(error) as raised:
        sandbox.transition(op, state, "sb1")
    assert raised.value.message == sentence
    assert (op, state) not in sandbox.TRANSITIONS


# -- a task -----------------------------------------------------------------------------------

TASK_ALLOWED = [
    (TOp.START, T.CREATED, T.RUNNING),
    (TOp.EXIT, T.RUNNING, T.STOPPED),
    (TOp.KILL, T.RUNNING, T.RUNNING),
    (TOp.KILL, T.STOPPED, T.STOPPED),  # killing an exited task does nothing
    (TOp.DELETE, T.CREATED, T.DELETED),
    (TOp.DELETE, T.STOPPED, T.DELETED),
    *((op, T.RUNNING, T.RUNNING) for op in (TOp.EXEC, TOp.UPDATE, TOp.REOPEN_LOG)),
    *((op, status, status) for op in (TOp.WAIT, TOp.STATE, TOp.STATS) for status in (T.CREATED, T.RUNNING, T.STOPPED)),
]
TASK_REFUSED = [
    (TOp.START, T.RUNNING, "task app is already running"),
    (TOp.START, T.STOPPED, "task app has exited; a stopped task cannot be started again"),
    (TOp.KILL, T.CREATED, "task app has not been started"),
    (TOp.DELETE, T.RUNNING, "task app is running; kill it and wait for its exit before deleting it"),
    (TOp.EXIT, T.CREATED, "cannot exit task app while it is created"),
    (TOp.EXIT, T.STOPPED, "cannot exit task app while it is stopped"),
    *((op, T.CREATED, "task app is not running: it has not been started")
      for op in (TOp.EXEC, TOp.UPDATE, TOp.REOPEN_LOG)),
    *((op, T.STOPPED, "task app is not running: it has exited") for op in (TOp.EXEC, TOp.UPDATE, TOp.REOPEN_LOG)),
    *((op, T.DELETED, f"cannot {op.value} task app while it is deleted") for op in TOp),
]


def test_every_task_operation_in_every_status_is_either_allowed_or_refused_here() -> None:
    specified = [(op, status) for op, status, _ in TASK_ALLOWED] + [(op, status) for op, status, _ in TASK_REFUSED]
    assert sorted(specified) == sorted(itertools.product(TOp, T))


@pytest.mark.parametrize("op, status, after", TASK_ALLOWED)
def test_an_allowed_task_transition_gives_the_next_status(op, status, after) -> None:
    assert tasks.transition(op, status, "app") is after
    assert tasks.TRANSITIONS[(op, status)] is after


@pytest.mark.parametrize("op, status, sentence", TASK_REFUSED)
def test_a_refused_task_transition_is_a_failed_precondition_that_says_why(op, status, sentence) -> None:
    with pytest.raises(FailedPrecondition) as raised:
        tasks.transition(op, status, "app")
    assert raised.value.message == sentence
    assert (op, status) not in tasks.TRANSITIONS
