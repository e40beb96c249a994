"""The transition table: every allowed transition, every rejected pair, and the metrics they export."""

from __future__ import annotations

import itertools

import pytest

from agent.metrics import AgentMetrics
from agent.states import AGENT_STATES, TRANSITIONS, Event, InvalidTransition, State, StateMachine
from tests.agent.builders import VirtualClock

ALLOWED = sorted(TRANSITIONS.items(), key=lambda item: (item[0][0].value, item[0][1].value))
REJECTED = [(s, e) for s, e in itertools.product(State, Event) if (s, e) not in TRANSITIONS]


def machine_in(state: State) -> tuple[StateMachine, AgentMetrics]:
    metrics = AgentMetrics("r0", "pool")
    machine = StateMachine(VirtualClock(), initial=state)
    machine.subscribe(metrics.on_transition)
    metrics.state.labels(State.STARTING.value).set(0)
    metrics.state.labels(state.value).set(1)
    return machine, metrics


@pytest.mark.parametrize(
    ("source", "event", "target"), [(s, e, t) for (s, e), t in ALLOWED], ids=lambda v: getattr(v, "value", v)
)
def test_allowed_transition_moves_state_and_is_exported(source: State, event: Event, target: State) -> None:
    machine, metrics = machine_in(source)
    transition = machine.fire(event)
    assert (machine.state, transition.source, transition.target) == (target, source, target)
    labels = {"source": source.value, "event": event.value, "target": target.value}
    assert metrics.registry.get_sample_value("llmfleet_agent_transitions_total", labels) == 1.0
    assert metrics.registry.get_sample_value("llmfleet_agent_state", {"state": target.value}) == 1.0
    if source is not target:
        assert metrics.registry.get_sample_value("llmfleet_agent_state", {"state": source.value}) == 0.0
    ready = metrics.registry.get_sample_value("llmfleet_agent_ready")
    assert ready == (1.0 if target is State.READY else 0.0)


@pytest.mark.parametrize(("state", "event"), REJECTED, ids=lambda v: v.value)
def test_event_outside_the_table_raises_and_keeps_state(state: State, event: Event) -> None:
    machine, _ = machine_in(state)
    with pytest.raises(InvalidTransition, match=event.value):
        machine.fire(event)
    assert machine.state is state


def test_every_state_but_stopped_accepts_a_drain() -> None:
    accepting = {s for s in AGENT_STATES if (s, Event.DRAIN) in TRANSITIONS or s is State.DRAINING}
    assert accepting == set(AGENT_STATES) - {State.STOPPED}


def test_stopped_is_terminal_and_every_other_state_is_reachable() -> None:
    assert not [e for (s, e) in TRANSITIONS if s is State.STOPPED]
    reached = {State.STARTING} | set(TRANSITIONS.values())
    assert reached == set(AGENT_STATES)


def test_crash_loop_raises_the_alert_metric_until_reset() -> None:
    machine, metrics = machine_in(State.RESTARTING)
    machine.fire(Event.CRASH_LOOP)
    assert metrics.registry.get_sample_value("llmfleet_agent_crash_loop") == 1.0
    machine.fire(Event.RESET)
    assert metrics.registry.get_sample_value("llmfleet_agent_crash_loop") == 0.0


def test_only_a_ready_replica_sleeps_and_a_wake_returns_to_ready_through_waking() -> None:
    assert {s for (s, e) in TRANSITIONS if e is Event.SLEEP} == {State.READY}
    machine, metrics = machine_in(State.READY)
    for event, state in ((Event.SLEEP, State.SLEEPING), (Event.WAKE, State.WAKING), (Event.WOKEN, State.READY)):
        machine.fire(event)
        assert machine.state is state
        assert machine.ready is (state is State.READY)
    assert TRANSITIONS[(State.WAKING, Event.WAKE_FAILED)] is State.RESTARTING
