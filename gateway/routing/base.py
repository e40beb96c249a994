"""Routing base: the filter -> score -> pick pipeline over a frozen snapshot of endpoint load.

Plugins are small classes registered by name (``class Ready(Filter, name="ready")``) into one
`fleet.spec.plugins.Registry` per kind (`FILTERS`, `SCORERS`, `PICKERS`, also exposed as ``REGISTRY`` by
`gateway.routing.filters`, `.scorers` and `.pickers`). A plugin with parameters declares a nested ``Params``
model and takes one instance of it; the stack loader validates the same model, so a misspelled parameter fails
``llmfleet validate``. Every plugin of a kind has the same synchronous signature and takes the whole request
as one frozen `RequestInfo`; none performs I/O.

`Router.route` owns what plugins must not: it stops when a filter empties the set, clamps each scorer's values
into [0, 1] (NaN -> 0), multiplies by the configured weight, sums, and times every plugin call.

Affinity scorers (``Scorer.affinity = True``: ``session-affinity``, ``prefix-affinity``) say where the request's
cached state lives. The runner also sums their weighted values alone into `Scored.affinity`, so a picker can
tell "preferred because of cached state" apart from "preferred because idle": `anchor` is the candidate with
the highest positive affinity, and `within_bound` says whether its load leaves room to honour it (see p2c).
A scorer that knows what each engine holds (``Scorer.spares_prefill = True``: ``kv-cache``) scores the share of
the prompt's prefill a replica is spared; the runner keeps the largest such value as `Scored.spared`, and the
bound grows with it: a replica that needs to prefill a tenth of a prompt can take more requests than one that
prefills all of it.
"""

from __future__ import annotations

import abc
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from fleet.spec.plugins import ROUTING_FILTER, ROUTING_PICKER, ROUTING_SCORER, PluginParams, Registry
from fleet.spec.stack import PluginRef

__all__ = [
    "FILTERS",
    "PICKERS",
    "SCORERS",
    "Decision",
    "EndpointView",
    "Filter",
    "Picker",
    "RequestInfo",
    "Router",
    "Scored",
    "Scorer",
    "anchor",
    "endpoint_load",
    "expected_prefill",
    "within_bound",
]


@dataclass(frozen=True, slots=True)
class EndpointView:
    """One replica as routing sees it at one instant."""

    id: str
    url: str
    pool: str
    model: str
    ready: bool
    ejected: bool
    metrics_age_s: float | None  # None: never scraped successfully
    running: float  # engine gauges from the last scrape (0 when never scraped)
    waiting: float
    kv_usage: float
    in_flight: int  # this gateway's requests currently on the replica
    max_num_seqs: int  # the engine's batch size (from the pool spec)
    adapters: frozenset[str] = frozenset()  # LoRA adapters the engine serves (its /v1/models)
    active_adapters: frozenset[str] = frozenset()  # adapters of its running or waiting requests (last scrape)
    # this gateway's open requests on the replica, in prompt tokens: those before their first answer byte, less
    # the prefix the router expected it to hold (still to prefill), and those after it (contexts being decoded)
    prefill_tokens: int = 0
    context_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """Everything a plugin may read about the request being routed."""

    request_id: str
    model: str
    tenant: str
    priority: int
    prompt: str  # the prompt text (chat messages joined) used for prefix affinity
    session_id: str | None
    now: float
    adapter: str | None = None  # the LoRA adapter the request names as its model
    token_ids: tuple[int, ...] | None = None  # the prompt as the engine tokenizes it (the pool's tokenizer), if known
    estimated_tokens: int = 0  # the prompt's tokens estimated from its characters (`gateway.body`)
    cache_salt: str | None = None  # the salt the engine gets (`gateway.cache_salt`): its prefix cache is per salt

    @property
    def prompt_tokens(self) -> int:
        """The prompt's tokens: counted when the token ids are known, else the estimate."""
        return len(self.token_ids) if self.token_ids else self.estimated_tokens


@dataclass(frozen=True, slots=True)
class Scored:
    endpoint: EndpointView
    score: float  # weighted sum of every scorer
    affinity: float = 0.0  # the part of ``score`` that came from affinity scorers
    spared: float = 0.0  # the share of the prompt's prefill the replica's cache spares (unweighted, in [0, 1])


def expected_prefill(prompt_tokens: int, spared: float) -> int:
    """The tokens a replica is expected to prefill for a prompt of ``prompt_tokens``, ``spared`` of which its cache
    holds: what the gateway (`gateway.upstream.Attempt`) and the simulator count as its queued prefill."""
    return round((1.0 - spared) * prompt_tokens)


def endpoint_load(endpoint: EndpointView) -> float:
    """Requests on the replica: this gateway's in-flight count or the engine's running + waiting, the larger."""
    return max(float(endpoint.in_flight), endpoint.running + endpoint.waiting)


def anchor(candidates: Sequence[Scored]) -> Scored | None:
    """The candidate with the highest positive affinity (ties: higher score, then the first); None if no affinity."""
    best: Scored | None = None
    for candidate in candidates:
        if candidate.affinity > 0.0 and (
            best is None or (candidate.affinity, candidate.score) > (best.affinity, best.score)
        ):
            best = candidate
    return best


def within_bound(preferred: Scored, candidates: Sequence[Scored], load_factor: float) -> bool:
    """Whether ``preferred`` may take one more request: load <= (``load_factor`` x mean candidate load + 1) x
    (1 + its `Scored.spared`).

    The +1 keeps a nearly idle fleet sticky when a gauge still counts the session's previous request. The bound
    counts requests, not work: a request whose prompt the replica mostly holds costs it a fraction of the
    prefill, so the bound grows with the share spared, to at most twice (a request still decodes in full).
    """
    mean = sum(endpoint_load(c.endpoint) for c in candidates) / len(candidates)
    return endpoint_load(preferred.endpoint) <= (load_factor * mean + 1.0) * (1.0 + preferred.spared)


@dataclass(frozen=True)
class Decision:
    endpoint: EndpointView
    candidates: int  # endpoints left after the filters
    score: float
    spared: float = 0.0  # the chosen one's `Scored.spared`: the share of the prompt its cache was expected to hold


FILTERS: Registry[Filter] = Registry(ROUTING_FILTER)
SCORERS: Registry[Scorer] = Registry(ROUTING_SCORER)
PICKERS: Registry[Picker] = Registry(ROUTING_PICKER)


class Filter(abc.ABC):
    """Keeps the endpoints that may serve the request. Returning an empty sequence ends routing (503)."""

    name: ClassVar[str]
    Params: ClassVar[type[PluginParams]] = PluginParams

    def __init_subclass__(cls, *, name: str, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        FILTERS.register(name, cls)

    def __init__(self, params: PluginParams | None = None) -> None:
        del params  # Takes none.

    @abc.abstractmethod
    def filter(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[EndpointView]: ...


class Scorer(abc.ABC):
    """Scores each endpoint in [0, 1] (1 = best), index-aligned with ``endpoints``.

    ``affinity = True`` marks a scorer whose score means "this replica holds the request's cached state"
    (its weighted values also go to `Scored.affinity`); load scorers leave it False. ``spares_prefill = True``
    marks one whose score is the share of the prompt's prefill the replica is spared, known from the engines
    themselves (its values, unweighted, go to `Scored.spared`); a scorer that guesses leaves it False.
    """

    name: ClassVar[str]
    Params: ClassVar[type[PluginParams]] = PluginParams
    affinity: ClassVar[bool] = False
    spares_prefill: ClassVar[bool] = False

    def __init_subclass__(cls, *, name: str, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        SCORERS.register(name, cls)

    def __init__(self, params: PluginParams | None = None) -> None:
        del params  # Takes none.

    @abc.abstractmethod
    def score(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Sequence[float]: ...

    def observe(self, request: RequestInfo, chosen: EndpointView) -> None:  # noqa: B027 - optional hook
        """Called with the routing outcome (stateful scorers such as prefix affinity learn from it)."""


class Picker(abc.ABC):
    """Chooses one of the scored candidates (never called with an empty sequence).

    Every picker takes ``seed`` (its random draws; None: from the OS), for reproducible tests and simulations.
    """

    class Params(PluginParams):
        seed: int | None = None
        """Seed of the picker's random draws (tests and simulations)."""

    name: ClassVar[str]

    def __init__(self, params: Params | None = None) -> None:
        self.rng = random.Random((params or Picker.Params()).seed)

    def __init_subclass__(cls, *, name: str, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        PICKERS.register(name, cls)

    @abc.abstractmethod
    def pick(self, candidates: Sequence[Scored], request: RequestInfo) -> EndpointView: ...


TimingHook = Callable[[str, float], None]


class Router:
    """The pipeline. ``on_timing(plugin_name, seconds)`` receives each plugin's latency when given."""

    def __init__(
        self,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
        on_timing: TimingHook | None = None,
    ) -> None:
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker
        self._on_timing = on_timing

    @classmethod
    def from_refs(
        cls,
        filters: Sequence[PluginRef],
        scorers: Sequence[PluginRef],
        picker: PluginRef,
        on_timing: TimingHook | None = None,
    ) -> Router:
        """The pipeline named by a stack's references; `fleet.spec.plugins.UnknownPlugin` or `BadParams` otherwise."""
        return cls(
            [FILTERS.create(f.name, f.params) for f in filters],
            [(SCORERS.create(s.name, s.params), s.weight) for s in scorers],
            PICKERS.create(picker.name, picker.params),
            on_timing,
        )

    def _timed(self, name: str, start: float) -> None:
        if self._on_timing is not None:
            self._on_timing(name, time.perf_counter() - start)

    def route(self, endpoints: Sequence[EndpointView], request: RequestInfo) -> Decision | None:
        """The chosen endpoint, or None when the filters leave nothing."""
        current: Sequence[EndpointView] = endpoints
        for flt in self.filters:
            start = time.perf_counter()
            current = flt.filter(current, request)
            self._timed(flt.name, start)
            if not current:
                return None
        totals = [0.0] * len(current)
        affinity = [0.0] * len(current)
        spared = [0.0] * len(current)
        if len(current) > 1:
            for scorer, weight in self.scorers:
                start = time.perf_counter()
                values = scorer.score(current, request)
                self._timed(scorer.name, start)
                for i, value in enumerate(values):
                    clamped = _clamp(value)
                    weighted = weight * clamped
                    totals[i] += weighted
                    if scorer.affinity:
                        affinity[i] += weighted
                    if scorer.spares_prefill:
                        spared[i] = max(spared[i], clamped)
        start = time.perf_counter()
        scored = [Scored(*row) for row in zip(current, totals, affinity, spared, strict=True)]
        chosen = self.picker.pick(scored, request)
        self._timed(self.picker.name, start)
        for scorer, _ in self.scorers:
            scorer.observe(request, chosen)
        at = [e.id for e in current].index(chosen.id)
        return Decision(chosen, len(current), totals[at], spared[at])


def _clamp(value: float) -> float:
    if math.isnan(value):
        return 0.0
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value
