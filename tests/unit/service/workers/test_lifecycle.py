"""A worker's life as its supervisor sees it (service/workers/lifecycle.py), alone: every
transition from every state (legal ones move, the others raise and move nothing), the restart
backoff, the crash window, the heartbeat's decisions and the text the log shows. No processes,
no clock: the time is passed in."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from textserve.service.metrics_server import READY_STATES
from textserve.service.workers.lifecycle import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    CRASH_LIMIT,
    CRASH_WINDOW,
    Beat,
    CrashWindow,
    IllegalTransition,
    Lifecycle,
    WorkerState,
    backoff,
    describe_exit,
    server_readiness,
)

S = WorkerState
LIVE = {S.STARTING, S.WARM, S.SERVING, S.NO_MODEL, S.DRAINING, S.UNRESPONSIVE}
ANSWERING = {S.WARM, S.SERVING, S.NO_MODEL, S.DRAINING}

Transition = Callable[[Lifecycle], object]
# Every transition: the states it leaves from, and where each goes (a report of the state a
# worker is in changes nothing; so does any report from an UNRESPONSIVE worker).
TRANSITIONS: dict[str, tuple[Transition, dict[WorkerState, WorkerState]]] = {
    "spawned": (
        lambda life: life.spawned(100.0),
        {S.NEW: S.STARTING, S.RESTARTING: S.STARTING},
    ),
    "warm": (lambda life: life.warm(), {S.STARTING: S.WARM}),
    "reported serving": (
        lambda life: life.reported("serving"),
        {S.WARM: S.SERVING, S.NO_MODEL: S.SERVING, S.SERVING: S.SERVING}
        | {S.UNRESPONSIVE: S.UNRESPONSIVE},
    ),
    "reported no model": (
        lambda life: life.reported("no model"),
        {S.WARM: S.NO_MODEL, S.SERVING: S.NO_MODEL, S.NO_MODEL: S.NO_MODEL}
        | {S.UNRESPONSIVE: S.UNRESPONSIVE},
    ),
    "reported draining": (
        lambda life: life.reported("draining"),
        {s: S.DRAINING for s in (S.STARTING, S.WARM, S.SERVING, S.NO_MODEL, S.DRAINING)}
        | {S.UNRESPONSIVE: S.UNRESPONSIVE},
    ),
    "startup_failed": (lambda life: life.startup_failed("no model"), {s: s for s in LIVE}),
    "killed_unresponsive": (
        lambda life: life.killed_unresponsive(),
        {s: S.UNRESPONSIVE for s in ANSWERING},
    ),
    "died": (lambda life: life.died(1, 100.0), {s: S.RESTARTING for s in LIVE}),
    "stopped": (lambda life: life.stopped(0), {s: S.STOPPED for s in LIVE}),
    "failed": (lambda life: life.failed(2), {s: S.FAILED for s in LIVE}),
    "restart_cancelled": (lambda life: life.restart_cancelled(), {S.RESTARTING: S.STOPPED}),
}
CASES = [(name, state) for name in TRANSITIONS for state in WorkerState]


def in_state(state: WorkerState) -> Lifecycle:
    life = Lifecycle(state=state)
    if state is S.RESTARTING:
        life.restart_at, life.exit_code = 10.0, 1
    return life


@pytest.mark.parametrize(("name", "state"), CASES, ids=[f"{n}-{s.name}" for n, s in CASES])
def test_every_transition_from_every_state(name: str, state: WorkerState) -> None:
    transition, legal = TRANSITIONS[name]
    life = in_state(state)
    if state in legal:
        transition(life)
        assert life.state is legal[state]
    else:
        with pytest.raises(IllegalTransition, match=state.value):
            transition(life)
        assert life.state is state


@pytest.mark.parametrize("state", sorted(set(WorkerState) - {S.UNRESPONSIVE}, key=str))
@pytest.mark.parametrize("said", ["warming", "warm", "starting", "unresponsive", "bogus"])
def test_what_is_not_a_worker_readiness_is_refused(state: WorkerState, said: str) -> None:
    life = in_state(state)
    with pytest.raises(IllegalTransition):
        life.reported(said)
    assert life.state is state


def test_reports_say_whether_they_changed_anything() -> None:
    life = in_state(S.WARM)
    assert life.reported("serving") is True
    assert life.reported("serving") is False
    assert life.reported("no model") is True
    life.killed_unresponsive()
    assert life.reported("serving") is False  # being killed: what it said before is moot
    assert life.state is S.UNRESPONSIVE


def test_a_whole_life_reads_in_order() -> None:
    life = Lifecycle()
    seen = [life.text]
    life.spawned(0.0)
    seen.append(life.text)
    life.warm()
    seen.append(life.text)
    life.reported("serving")
    seen.append(life.text)
    life.reported("draining")
    seen.append(life.text)
    life.stopped(0)
    seen.append(life.text)
    assert seen == ["new", "starting", "warm", "serving", "draining", "stopped (status 0)"]


# -- the restart backoff and the crash window ---------------------------------------------


def test_the_backoff_doubles_per_death_in_a_row_up_to_the_cap() -> None:
    assert [backoff(n) for n in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff(0) == BACKOFF_FIRST and backoff(1000) == BACKOFF_MAX


def test_each_death_waits_longer_until_the_worker_serves_again() -> None:
    life, delays = Lifecycle(), []
    for n in range(4):
        life.spawned(float(n))
        delays.append(life.died(1, 1000.0))
    assert delays == [0.5, 1.0, 2.0, 4.0] and life.deaths_in_a_row == 4
    assert life.restart_at == 1004.0
    life.spawned(1004.0)
    life.warm()
    life.reported("no model")
    assert life.deaths_in_a_row == 4  # without a model it has not served yet
    life.reported("serving")
    assert life.deaths_in_a_row == 0
    assert life.died(-9, 2000.0) == BACKOFF_FIRST


def test_the_restart_is_due_at_restart_at_and_only_while_restarting() -> None:
    life = Lifecycle()
    life.spawned(0.0)
    assert not life.restart_due(1e9)
    life.died(1, 100.0)
    assert not life.restart_due(100.4)
    assert life.restart_due(100.5)
    life.restart_cancelled()
    assert not life.restart_due(1e9) and life.restart_at is None


def test_a_respawn_forgets_how_the_last_process_ended_but_not_the_deaths() -> None:
    life = Lifecycle()
    life.spawned(0.0)
    life.startup_failed("no model in /models")
    life.died(2, 5.0)
    life.spawned(6.0)
    assert (life.failure, life.exit_code, life.killed, life.restart_at) == ("", None, False, None)
    assert life.deaths_in_a_row == 1 and life.heard_at == 6.0


def test_the_crash_window_counts_deaths_within_crash_window_seconds() -> None:
    window = CrashWindow()
    assert not any(window.record(t) for t in (0.0, 1.0, 2.0, 3.0))
    assert window.record(4.0)  # the CRASH_LIMIT-th within CRASH_WINDOW
    spread = CrashWindow()
    assert not any(spread.record(n * CRASH_WINDOW) for n in range(3 * CRASH_LIMIT))
    assert spread.deaths == [(3 * CRASH_LIMIT - 1) * CRASH_WINDOW]


# -- the heartbeat --------------------------------------------------------------------------


@pytest.mark.parametrize("state", list(WorkerState), ids=lambda s: s.name)
def test_only_a_worker_past_its_startup_is_pinged_or_killed(state: WorkerState) -> None:
    life = in_state(state)  # heard_at 0: silent for ever
    beat = life.heartbeat(1e6, timeout=30.0, interval=1.0)
    assert beat is (Beat.KILL if state in ANSWERING else Beat.WAIT)


def test_a_worker_that_answers_is_pinged_every_interval() -> None:
    life = in_state(S.SERVING)
    life.heard(100.0)
    assert life.heartbeat(100.0, timeout=30.0, interval=1.0) is Beat.PING  # never pinged
    assert life.pinged(100.0) == 1
    assert life.heartbeat(100.5, timeout=30.0, interval=1.0) is Beat.WAIT
    assert life.heartbeat(101.0, timeout=30.0, interval=1.0) is Beat.PING
    assert life.pinged(101.0) == 2


def test_a_worker_silent_past_the_timeout_is_killed_not_before() -> None:
    life = in_state(S.WARM)
    life.heard(100.0)
    life.pinged(129.9)
    assert life.heartbeat(130.0, timeout=30.0, interval=1.0) is Beat.WAIT  # silent 30 s: not past
    assert life.heartbeat(130.1, timeout=30.0, interval=1.0) is Beat.KILL
    assert life.silence(130.1) == pytest.approx(30.1)
    life.heard(130.1)  # any message is a sign of life
    assert life.heartbeat(130.2, timeout=30.0, interval=1.0) is Beat.WAIT


def test_a_killed_worker_dies_unresponsive_and_says_so() -> None:
    life = in_state(S.SERVING)
    life.killed_unresponsive()
    assert life.heartbeat(1e6, timeout=1.0, interval=1.0) is Beat.WAIT  # killed once
    life.died(-9, 10.0)
    assert life.restart_reason == "unresponsive"
    assert life.text == "died with signal SIGKILL (unresponsive); restarting in 0.5s"
    life.spawned(11.0)
    life.died(-11, 12.0)
    assert life.restart_reason == "exited"


# -- the text and the server's readiness --------------------------------------------------


def test_the_text_is_derived_from_the_state() -> None:
    assert describe_exit(-15) == "signal SIGTERM" and describe_exit(3) == "status 3"
    life = Lifecycle()
    life.spawned(0.0)
    life.startup_failed("cannot load model")
    life.died(2, 0.0)
    assert life.text == "died with status 2: cannot load model; restarting in 0.5s"
    life.restart_cancelled()
    assert life.text == "stopped (status 2)"
    life = in_state(S.STARTING)
    life.failed(1)
    assert life.text == "exited with status 1" and life.how == "status 1"
    assert [in_state(s).text for s in LIVE - {S.NO_MODEL}] == [s.value for s in LIVE - {S.NO_MODEL}]
    assert in_state(S.NO_MODEL).text == "no model" and in_state(S.STARTING).how == ""


def test_the_worker_readiness_states_are_those_of_readyz() -> None:
    assert {S.SERVING.value, S.NO_MODEL.value, S.DRAINING.value} <= set(READY_STATES)


def test_only_a_starting_or_warm_worker_catches_up_from_the_admin_log() -> None:
    assert {s for s in WorkerState if in_state(s).catches_up} == {S.STARTING, S.WARM}
    assert {s for s in WorkerState if in_state(s).live} == LIVE


@pytest.mark.parametrize(
    ("states", "stopping", "ready"),
    [
        ([S.SERVING, S.SERVING], False, "serving"),
        ([S.SERVING, S.NO_MODEL], False, "no model"),
        ([S.NO_MODEL, S.NO_MODEL], False, "no model"),
        ([S.SERVING, S.WARM], False, "warming"),
        ([S.NO_MODEL, S.RESTARTING], False, "warming"),
        ([S.SERVING, S.DRAINING], False, "warming"),
        ([S.SERVING, S.UNRESPONSIVE], False, "warming"),
        ([S.NEW, S.NEW], False, "warming"),
        ([S.SERVING, S.SERVING], True, "draining"),
    ],
)
def test_the_server_is_ready_only_while_every_worker_serves(
    states: list[WorkerState], stopping: bool, ready: str
) -> None:
    assert server_readiness(states, stopping) == ready
