"""States: the agent's lifecycle as an explicit state machine with one transition table.

    fetching --FETCHED--> starting      (model store: weights into the node cache first; else the agent
        |                                 begins in starting)
        +---FETCH_FAILED--> restarting --REFETCH--> fetching   (until a fetch has succeeded)
    starting --HEALTHY--> warming --WARMED--> ready --DRAIN--> draining --DRAINED--> stopped
        |                    |                  |                  |
        |                    |                  +-PLANNED_RESTART--+  (restart window, lease held)
        |                    |                  |                  +--RESTART_DRAINED--> restarting
        +---ENGINE_EXITED / STARTUP_TIMEOUT-----+-ENGINE_EXITED / LIVENESS_FAILED-----> restarting
    restarting --RESPAWN--> starting            restarting --CRASH_LOOP--> failed
    failed --RESET (operator) / COOLDOWN_ELAPSED (crash window passed)--> restarting

    ready --SLEEP--> sleeping --WAKE--> waking --WOKEN--> ready        (sleep mode, `agent.sleeping`)
                       |                   |
                       +-SLEEP_FAILED / ENGINE_EXITED----> restarting
                                           +-WAKE_FAILED---> restarting   (a cold start; the check differed)

Every state except ``stopped`` accepts DRAIN: a drain always wins, and ``stopped`` is terminal. Readiness is
true in exactly one state, ``ready``. A (state, event) pair missing from the table is a bug in the caller:
`StateMachine.fire` raises `InvalidTransition` instead of guessing. A failed fetch counts as a crash, so fetches
back off and end in ``failed`` exactly as engine crashes do.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleet.protocol.clock import Clock
from fleet.protocol.wire import ReplicaState

__all__ = ["AGENT_STATES", "TRANSITIONS", "Event", "InvalidTransition", "State", "StateMachine", "Transition"]


State = ReplicaState
"""The agent's states are the fleet's `ReplicaState` (all but ``launching``, which only the control plane uses)."""
AGENT_STATES: tuple[State, ...] = tuple(s for s in State if s is not State.LAUNCHING)


class Event(enum.Enum):
    FETCHED = "fetched"
    FETCH_FAILED = "fetch_failed"
    REFETCH = "refetch"
    HEALTHY = "healthy"
    WARMED = "warmed"
    ENGINE_EXITED = "engine_exited"
    STARTUP_TIMEOUT = "startup_timeout"
    LIVENESS_FAILED = "liveness_failed"
    PLANNED_RESTART = "planned_restart"
    DRAIN = "drain"
    DRAINED = "drained"
    RESTART_DRAINED = "restart_drained"
    RESPAWN = "respawn"
    CRASH_LOOP = "crash_loop"
    RESET = "reset"
    COOLDOWN_ELAPSED = "cooldown_elapsed"
    SLEEP = "sleep"
    SLEEP_FAILED = "sleep_failed"
    WAKE = "wake"
    WOKEN = "woken"
    WAKE_FAILED = "wake_failed"


S, E = State, Event
TRANSITIONS: Mapping[tuple[State, Event], State] = {
    (S.FETCHING, E.FETCHED): S.STARTING,
    (S.FETCHING, E.FETCH_FAILED): S.RESTARTING,
    (S.FETCHING, E.DRAIN): S.DRAINING,
    (S.STARTING, E.HEALTHY): S.WARMING,
    (S.STARTING, E.ENGINE_EXITED): S.RESTARTING,
    (S.STARTING, E.STARTUP_TIMEOUT): S.RESTARTING,
    (S.STARTING, E.DRAIN): S.DRAINING,
    (S.WARMING, E.WARMED): S.READY,
    (S.WARMING, E.ENGINE_EXITED): S.RESTARTING,
    (S.WARMING, E.STARTUP_TIMEOUT): S.RESTARTING,
    (S.WARMING, E.DRAIN): S.DRAINING,
    (S.READY, E.ENGINE_EXITED): S.RESTARTING,
    (S.READY, E.LIVENESS_FAILED): S.RESTARTING,
    (S.READY, E.PLANNED_RESTART): S.DRAINING,
    (S.READY, E.DRAIN): S.DRAINING,
    (S.READY, E.SLEEP): S.SLEEPING,
    (S.SLEEPING, E.WAKE): S.WAKING,
    (S.SLEEPING, E.SLEEP_FAILED): S.RESTARTING,
    (S.SLEEPING, E.ENGINE_EXITED): S.RESTARTING,
    (S.SLEEPING, E.DRAIN): S.DRAINING,
    (S.WAKING, E.WOKEN): S.READY,
    (S.WAKING, E.WAKE_FAILED): S.RESTARTING,
    (S.WAKING, E.DRAIN): S.DRAINING,
    (S.DRAINING, E.DRAINED): S.STOPPED,
    (S.DRAINING, E.RESTART_DRAINED): S.RESTARTING,
    (S.RESTARTING, E.RESPAWN): S.STARTING,
    (S.RESTARTING, E.REFETCH): S.FETCHING,
    (S.RESTARTING, E.CRASH_LOOP): S.FAILED,
    (S.RESTARTING, E.DRAIN): S.DRAINING,
    (S.FAILED, E.RESET): S.RESTARTING,
    (S.FAILED, E.COOLDOWN_ELAPSED): S.RESTARTING,
    (S.FAILED, E.DRAIN): S.DRAINING,
}
del S, E


class InvalidTransition(RuntimeError):
    """An event that the current state does not accept (a caller bug, never retried)."""

    def __init__(self, state: State, event: Event) -> None:
        accepted = sorted(e.value for (s, e) in TRANSITIONS if s is state)
        super().__init__(
            f"event {event.value!r} is not allowed in state {state.value!r}; "
            f"accepted: {', '.join(accepted) or 'none (terminal)'}"
        )
        self.state = state
        self.event = event


@dataclass(frozen=True)
class Transition:
    source: State
    event: Event
    target: State
    at: float  # monotonic seconds


class StateMachine:
    """Holds the current state; `fire` applies the table and tells every listener (metrics, logs). Times are the
    clock's monotonic seconds."""

    def __init__(self, clock: Clock, initial: State = State.STARTING) -> None:
        self._clock = clock
        self.state = initial
        self.since = clock.monotonic()
        self.history: list[Transition] = []
        self._listeners: list[Callable[[Transition], None]] = []

    def subscribe(self, listener: Callable[[Transition], None]) -> None:
        self._listeners.append(listener)

    def accepts(self, event: Event) -> bool:
        return (self.state, event) in TRANSITIONS

    def fire(self, event: Event) -> Transition:
        """Move to the table's target state; InvalidTransition when the pair is not in the table."""
        target = TRANSITIONS.get((self.state, event))
        if target is None:
            raise InvalidTransition(self.state, event)
        transition = Transition(self.state, event, target, self._clock.monotonic())
        self.state, self.since = target, transition.at
        self.history.append(transition)
        del self.history[:-100]  # bounded: /status shows the recent ones
        for listener in self._listeners:
            listener(transition)
        return transition

    @property
    def ready(self) -> bool:
        return self.state is State.READY
