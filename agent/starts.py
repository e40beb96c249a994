"""Starts: the breakdown of the current (or last) engine start, for ``/status`` and the agent's metrics.

A start begins with its model fetch, or with a launch that no fetch went before (a restart from the local copy):

* ``fetch_s``   -- the agent's own model fetch (`agent.model_store`, the adapters' too); near 0 when cached, None
  without a store or on a restart that fetched nothing.
* ``load_s``, ``compile_s``, ``graphs_s`` -- what the engine logged (`agent.engine_log`), read line by line as the
  engine writes them (`agent.launchers.output`); None for a phase the engine did not log (``--enforce-eager``
  compiles nothing and captures no graphs). A phase the engine only brackets with two lines (vLLM on CPU: its
  compiling warm-up run, as ``compile_s``) is timed on the injected monotonic clock, from the opening line's arrival
  to the closing one's.
* ``ready_s``   -- the agent's clock from the launch to the first healthy ``/health``.

The image pull is not here: on Kubernetes it happens before the agent exists, and only the kubelet knows it.

Times are passed in (``now`` on the monotonic clock, ``wall`` on the Unix one). Each start's phases also go to the
gauge ``llmfleet_agent_start_phase_seconds{phase}``, which is cleared when a new start begins, so it never mixes
two starts either.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Gauge

from agent.engine_log import PhaseLine, PhaseMark, StartPhase, parse_line
from agent.status import StartInfo

__all__ = ["StartRecorder"]


@dataclass
class _Start:
    started_at: float  # Unix seconds
    seconds: dict[StartPhase, float] = field(default_factory=dict)
    ranks: dict[StartPhase, int] = field(default_factory=dict)
    opened: dict[StartPhase, float] = field(default_factory=dict)  # monotonic: a PhaseMark's opening line came
    launched: float | None = None  # monotonic


class StartRecorder:
    """Records one start at a time; `launched` hands out the line sink of that start's engine output."""

    def __init__(self, gauge: Gauge, monotonic: Callable[[], float] = time.monotonic) -> None:
        """``monotonic``: the clock that times the phases the engine only brackets (`agent.engine_log.PhaseMark`)."""
        self._gauge = gauge
        self._monotonic = monotonic
        self._start: _Start | None = None
        self._fetch_began: float | None = None
        self._fetched = False  # a fetch finished and its launch has not come yet

    def fetch_began(self, now: float, wall: float) -> None:
        self._begin(wall)
        self._fetch_began, self._fetched = now, False

    def fetch_done(self, now: float) -> None:
        if self._start is None or self._fetch_began is None:
            return
        self._set(self._start, StartPhase.FETCH, now - self._fetch_began, rank=0)
        self._fetch_began, self._fetched = None, True

    def launched(self, now: float, wall: float) -> Callable[[str], None]:
        """The engine was just launched: a new start unless a fetch led up to it. Returns the sink for the
        engine's output lines; a sink of an earlier start ignores whatever its engine still writes."""
        if not self._fetched or self._start is None:
            self._begin(wall)
        self._fetched = False
        start = self._start
        assert start is not None
        start.launched = now

        def sink(line: str) -> None:
            found = parse_line(line)
            if found is None or start is not self._start:
                return
            if isinstance(found, PhaseMark):
                found = self._marked(start, found)
                if found is None:
                    return
            held = start.ranks.get(found.phase)
            if held is None or found.rank > held:
                self._set(start, found.phase, found.seconds, found.rank)
            elif found.rank == held and found.seconds > start.seconds[found.phase]:
                self._set(start, found.phase, found.seconds, found.rank)

        return sink

    def _marked(self, start: _Start, mark: PhaseMark) -> PhaseLine | None:
        """An opening line starts the phase's timer; a closing one stops it and says how long it ran."""
        now = self._monotonic()
        if mark.begins:
            start.opened[mark.phase] = now
            return None
        began = start.opened.pop(mark.phase, None)
        return None if began is None else PhaseLine(mark.phase, now - began, mark.rank)

    def healthy(self, now: float) -> None:
        """The engine answered its first healthy ``/health`` since the launch."""
        start = self._start
        if start is not None and start.launched is not None and StartPhase.READY not in start.seconds:
            self._set(start, StartPhase.READY, now - start.launched, rank=0)

    def info(self) -> StartInfo | None:
        """The current or last start; None before the first one began."""
        start = self._start
        if start is None:
            return None
        s = start.seconds

        def seconds(phase: StartPhase) -> float | None:
            value = s.get(phase)
            return None if value is None else round(value, 3)

        return StartInfo(
            started_at=start.started_at,
            fetch_s=seconds(StartPhase.FETCH),
            load_s=seconds(StartPhase.LOAD),
            compile_s=seconds(StartPhase.COMPILE),
            graphs_s=seconds(StartPhase.GRAPHS),
            ready_s=seconds(StartPhase.READY),
        )

    def _begin(self, wall: float) -> None:
        self._start = _Start(started_at=wall)
        self._fetch_began = None
        self._gauge.clear()

    def _set(self, start: _Start, phase: StartPhase, seconds: float, rank: int) -> None:
        start.seconds[phase], start.ranks[phase] = seconds, rank
        self._gauge.labels(phase.value).set(seconds)
