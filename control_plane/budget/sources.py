"""Budget sources: where the error budget's request counts come from, one plugin per place that counts them.

    class BudgetSource:
        async def observe(self, query: BudgetQuery) -> fleet.slo.budget.Observed

Sources are registered by name in `SOURCES` and built with `make_source(name, params, client)`; an unknown name
or parameter fails there, listing the valid ones. Both read the gateway's series (`gateway.metrics`):
``llmfleet_gateway_requests_total{model,status}`` and ``llmfleet_gateway_ttft_seconds_bucket{model,le}``.

* ``prometheus`` (params: ``url``, ``timeoutS``): instant queries to ``<url>/api/v1/query`` of
  ``increase(...[window])`` at ``now``, and of the same series over each planned maintenance interval inside the
  window (``increase(...[length] @ end)``), which `fleet.slo.budget` subtracts. The counts are taken to span
  the whole window.
* ``local`` (no params): scrapes the admin ``/metrics`` of the gateways in ``query.gateways`` (those reporting to
  the control plane), at most once a second, and keeps the increase between two scrapes of a gateway in
  per-minute buckets, in memory: the counts start at the control plane's first scrape of each gateway (that scrape
  is the baseline), cover ``min(window, time since the first scrape)``, and are lost when the control plane
  restarts. A minute whose start falls inside a planned interval counts as excluded. A counter that went down
  (the gateway restarted) counts from zero again.

Planned intervals come from the pool's restart window (`planned_intervals`, over `agent.windows.occurrences`).
A source that cannot read its counts raises `BudgetSourceError`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

import httpx
from pydantic import Field, ValidationError

from agent.windows import occurrences
from fleet.protocol import promtext
from fleet.slo.budget import Observed, SloTally, Tally, overlap_s, within_threshold
from fleet.spec.plugins import PluginParams
from fleet.spec.stack import PoolSpec, SloSpec

__all__ = [
    "SOURCES",
    "BudgetQuery",
    "BudgetSource",
    "BudgetSourceError",
    "LocalSource",
    "PrometheusSource",
    "make_source",
    "planned_intervals",
]

REQUESTS = "llmfleet_gateway_requests_total"
TTFT = "llmfleet_gateway_ttft_seconds"
SOURCES: dict[str, type[BudgetSource]] = {}


class BudgetSourceError(Exception):
    """The source could not produce counts (unreachable, malformed answer); the caller keeps what it had."""


@dataclass(frozen=True)
class BudgetQuery:
    """Everything a source needs for one pool at one instant."""

    pool: str
    model: str  # the served model name: the ``model`` label of the gateway's series
    slo: SloSpec
    now: float  # epoch seconds
    planned: tuple[tuple[float, float], ...] = ()  # planned maintenance intervals overlapping the window
    gateways: tuple[str, ...] = ()  # admin /metrics URLs of the gateways reporting to the control plane

    @property
    def since(self) -> float:
        return self.now - self.slo.budget_window_s


def planned_intervals(pool: PoolSpec, since: float, until: float) -> tuple[tuple[float, float], ...]:
    """The pool's restart-window occurrences overlapping ``[since, until]`` (epoch seconds); none when its
    restarts are disabled (then nothing is planned)."""
    if not pool.restart_window.enabled:
        return ()
    spans = occurrences(pool.restart_window, datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC))
    return tuple((a.timestamp(), b.timestamp()) for a, b in spans)


class BudgetSource(abc.ABC):
    name: ClassVar[str]

    class Params(PluginParams):
        pass

    def __init_subclass__(cls, *, name: str, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.name = name
        SOURCES[name] = cls

    @abc.abstractmethod
    async def observe(self, query: BudgetQuery) -> Observed:
        """The pool's counts per SLO over its budget window; `BudgetSourceError` when they cannot be read."""


def make_source(name: str, params: Mapping[str, Any], client: httpx.AsyncClient) -> BudgetSource:
    """Source ``name`` with its parameters (camelCase or snake_case keys); ValueError lists what is valid."""
    if name not in SOURCES:
        raise ValueError(f"unknown budget source {name!r}; sources: {', '.join(sorted(SOURCES))}")
    cls = SOURCES[name]
    try:
        parsed = cls.Params.model_validate(dict(params))
    except ValidationError as exc:
        allowed = ", ".join(sorted(f.alias or n for n, f in cls.Params.model_fields.items())) or "none"
        raise ValueError(f"budget source {name!r}: {exc.errors()[0]['msg']}; parameters: {allowed}") from None
    return cls(parsed, client)  # type: ignore[call-arg]


class PrometheusSource(BudgetSource, name="prometheus"):
    """Counts from a Prometheus that scrapes the gateways (see the module docstring for the queries)."""

    class Params(PluginParams):
        url: str = Field(pattern=r"^https?://")
        """Base URL of the Prometheus HTTP API (e.g. http://prometheus:9090)."""
        timeout_s: float = Field(default=5.0, gt=0, le=60)
        """Per query."""

    def __init__(self, params: Params, client: httpx.AsyncClient) -> None:
        self.params = params
        self._client = client
        self._url = params.url.rstrip("/") + "/api/v1/query"

    async def _query(self, expr: str, at: float) -> list[dict[str, Any]]:
        try:
            response = await self._client.post(
                self._url, data={"query": expr, "time": f"{at:.3f}"}, timeout=self.params.timeout_s
            )
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise BudgetSourceError(f"prometheus at {self.params.url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200 or body.get("status") != "success":
            raise BudgetSourceError(
                f"prometheus query {expr[:120]!r}: HTTP {response.status_code}: {body.get('error')}"
            )
        data = body.get("data", {})
        if data.get("resultType") != "vector":
            raise BudgetSourceError(f"prometheus query {expr[:120]!r}: a {data.get('resultType')}, not a vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    async def _scalar(self, expr: str, at: float) -> float:
        result = await self._query(expr, at)
        return sum(float(item["value"][1]) for item in result)

    async def observe(self, query: BudgetQuery) -> Observed:
        window, now = query.slo.budget_window_s, query.now
        sel = f'model="{_escape(query.model)}"'
        every, bad = f"{REQUESTS}{{{sel}}}", f'{REQUESTS}{{{sel},status=~"5.."}}'
        span = f"[{window:.0f}s]"
        total = await self._scalar(f"sum(increase({every}{span}))", now)
        failed = await self._scalar(f"sum(increase({bad}{span}))", now)
        buckets = await self._query(f"sum by (le) (increase({TTFT}_bucket{{{sel}}}{span}))", now)
        bounds = sorted((float(b["metric"]["le"]), b["metric"]["le"], float(b["value"][1])) for b in buckets)
        threshold = query.slo.ttft_p99_ms / 1000.0
        ttft = _ttft_tally([(bound, count) for bound, _, count in bounds], threshold)

        pieces = [(max(a, query.since), min(b, now)) for a, b in query.planned]
        pieces = [(a, b) for a, b in pieces if b > a]
        tallies = {"availability": SloTally(Tally(total, failed)), "ttft": SloTally(ttft)}
        if pieces:

            def over_pieces(series: str) -> str:
                # One query for every interval: each term is that interval's increase, 0 where it has no data.
                return " + ".join(f"(sum(increase({series}[{b - a:.0f}s] @ {b:.3f})) or vector(0))" for a, b in pieces)

            ex_total = await self._scalar(over_pieces(every), now)
            ex_bad = await self._scalar(over_pieces(bad), now)
            ex_ttft = Tally()
            if bounds:
                # Only three buckets matter: the edges around the threshold and the last (every first token).
                below = [b for b in bounds if b[0] < threshold][-1:]
                above = [b for b in bounds if b[0] >= threshold][:1]
                needed = sorted(set(below + above + [bounds[-1]]))
                within = [
                    (bound, await self._scalar(over_pieces(f'{TTFT}_bucket{{{sel},le="{label}"}}'), now))
                    for bound, label, _ in needed
                ]
                ex_ttft = _ttft_tally(within, threshold)
            tallies = {
                "availability": SloTally(Tally(total, failed), Tally(ex_total, ex_bad)),
                "ttft": SloTally(ttft, ex_ttft),
            }
        tallies["error-rate"] = tallies["availability"]
        return Observed(tallies, covered_s=window, excluded_s=overlap_s(pieces, query.since, now))


class LocalSource(BudgetSource, name="local"):
    """Counts kept in memory from scraping the gateways' admin /metrics (see the module docstring)."""

    def __init__(self, params: BudgetSource.Params, client: httpx.AsyncClient, min_interval_s: float = 1.0) -> None:
        del params  # Unused: no parameters.
        self._client = client
        self.min_interval_s = min_interval_s
        self.first_scrape: float | None = None
        self._scraped_at = -math.inf
        self._last: dict[str, _Counts] = {}  # gateway URL -> its cumulative counts per model at the last scrape
        self.minutes: dict[str, dict[int, _Model]] = {}  # model -> minute -> increase attributed to it

    async def scrape(self, urls: Sequence[str], now: float) -> None:
        """Scrape each gateway once and file the increase since its previous scrape under ``now``'s minute."""
        if now - self._scraped_at < self.min_interval_s:
            return
        self._scraped_at = now
        for url in urls:
            try:
                response = await self._client.get(url, timeout=2.0)
                current = _Counts.parse(response.raise_for_status().text)
            except (httpx.HTTPError, ValueError):
                continue  # a gateway that is gone or mid-restart: its next answer carries the increase
            if self.first_scrape is None:
                self.first_scrape = now
            before = self._last.get(url)
            self._last[url] = current
            if before is None:
                continue  # the baseline
            minute = int(now // 60)
            for model, counts in current.models.items():
                per_minute = self.minutes.setdefault(model, {})
                grown = counts.minus(before.models.get(model, _Model()))
                per_minute[minute] = per_minute.get(minute, _Model()).plus(grown)

    async def observe(self, query: BudgetQuery) -> Observed:
        await self.scrape(query.gateways, query.now)
        minutes = self.minutes.get(query.model, {})
        for minute in [m for m in minutes if (m + 1) * 60 <= query.since]:
            del minutes[minute]  # out of the window for good
        inside, planned = _Model(), _Model()
        for minute, counts in minutes.items():
            inside = inside.plus(counts)
            if any(a <= minute * 60 < b for a, b in query.planned):
                planned = planned.plus(counts)
        threshold = query.slo.ttft_p99_ms / 1000.0
        start = query.since if self.first_scrape is None else max(query.since, self.first_scrape)
        covered = 0.0 if self.first_scrape is None else query.now - start
        availability = SloTally(Tally(inside.total, inside.bad), Tally(planned.total, planned.bad))
        ttft = SloTally(_ttft_tally(inside.sorted(), threshold), _ttft_tally(planned.sorted(), threshold))
        tallies = {"availability": availability, "error-rate": availability, "ttft": ttft}
        return Observed(tallies, covered_s=covered, excluded_s=overlap_s(query.planned, start, query.now))


@dataclass(frozen=True)
class _Model:
    """One model's counts: answers, 5xx answers, and the TTFT histogram's cumulative buckets."""

    total: float = 0.0
    bad: float = 0.0
    buckets: Mapping[float, float] = field(default_factory=dict)

    def minus(self, before: _Model) -> _Model:
        if self.total < before.total or any(c < before.buckets.get(b, 0.0) for b, c in self.buckets.items()):
            return self  # the counters were reset (a restarted gateway): all of them is new
        buckets = {b: c - before.buckets.get(b, 0.0) for b, c in self.buckets.items()}
        return _Model(self.total - before.total, max(0.0, self.bad - before.bad), buckets)

    def plus(self, other: _Model) -> _Model:
        keys = set(self.buckets) | set(other.buckets)
        buckets = {b: self.buckets.get(b, 0.0) + other.buckets.get(b, 0.0) for b in keys}
        return _Model(self.total + other.total, self.bad + other.bad, buckets)

    def sorted(self) -> list[tuple[float, float]]:
        return sorted(self.buckets.items())


@dataclass
class _Counts:
    models: dict[str, _Model] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> _Counts:
        samples = promtext.parse(text)
        out: dict[str, _Model] = {}
        for sample in samples.get(REQUESTS, []):
            model = sample.labels.get("model", "")
            bad = sample.value if sample.labels.get("status", "").startswith("5") else 0.0
            out[model] = out.get(model, _Model()).plus(_Model(sample.value, bad))
        for sample in samples.get(f"{TTFT}_bucket", []):
            model = sample.labels.get("model", "")
            out[model] = out.get(model, _Model()).plus(_Model(buckets={float(sample.labels["le"]): sample.value}))
        return cls(out)


def _ttft_tally(buckets: Sequence[tuple[float, float]], threshold_s: float) -> Tally:
    """First tokens observed, and those later than ``threshold_s`` (interpolated inside the cut bucket)."""
    if not buckets:
        return Tally()
    total = max(count for _, count in buckets)
    return Tally(total, max(0.0, total - within_threshold(buckets, threshold_s)))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
