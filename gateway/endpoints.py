"""Endpoints: the replicas of each pool, their load and health, kept fresh by a background loop.

Membership comes from the control plane (``GET /v1/pools/{pool}/replicas``, `fleet.protocol.wire.ReplicaList`, read
with the gateway's control credential) when one is configured, else from static engine URLs
(``PoolSpec.staticReplicas`` or ``--replica``). If the control plane is unreachable the last known membership stays
(in-flight work and routing go on). Every
``routing.scrapeIntervalS`` each engine is probed: ``/health`` (static mode: readiness) and ``/metrics``
(load, parsed with `fleet.protocol.promtext`). A replica the control plane reports as not ``ready`` or ``stale`` leaves
rotation on that refresh (``sleeping`` and ``waking`` are not ``ready``); an engine answering 503 (or a draining
vLLM's 500, `gateway.errors.UpstreamDraining`) leaves it until its next good probe. A sleeping vLLM answers
``/health`` 200 and queues what it is sent, so in static mode an engine whose
``vllm:engine_sleep_state{sleep_state="awake"}`` is 0 is not ready either (`fleet.protocol.promtext.engine_asleep`).

Passive outlier ejection (`OutlierPolicy`): ``consecutive_failures`` replica faults in a row (or one first-token
timeout: a hung engine) eject a replica for ``base_s x 2^(n-1)`` seconds (n = ejections in a row, capped at
``max_s``); at most ``max_fraction`` of a pool (at least one replica of a pool of two or more, never the only
one) is ejected at once.

In-flight counts: `EndpointSet.lease` holds one request on the replica a router picked (mapped from its
`EndpointView` by pool and id), so the routers' ``in_flight`` always counts this gateway's open requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp

from fleet.protocol.clock import Clock
from fleet.protocol.control_auth import ClientCredential
from fleet.protocol.promtext import EngineMetrics, engine_asleep, parse
from fleet.protocol.wire import ReplicaList
from fleet.spec.stack import PoolSpec
from gateway.routing.base import EndpointView

if TYPE_CHECKING:
    from gateway.kv_events import KvEventFeed

__all__ = [
    "Endpoint",
    "EndpointSet",
    "OutlierPolicy",
    "Refresher",
    "load_lines",
    "served_adapters",
    "static_replica_id",
]

log = logging.getLogger("llmfleet.gateway.endpoints")


@dataclass(frozen=True)
class OutlierPolicy:
    consecutive_failures: int = 3
    base_s: float = 5.0
    max_s: float = 300.0
    max_fraction: float = 0.5

    def backoff(self, ejections: int) -> float:
        return min(self.max_s, self.base_s * 2.0 ** max(0, ejections - 1))

    def may_eject(self, pool_size: int, ejected: int) -> bool:
        if pool_size < 2:
            return False
        return ejected + 1 <= max(1, math.floor(self.max_fraction * pool_size))


@dataclass
class Endpoint:
    """Mutable state of one replica; only `EndpointSet`, `Refresher` and an `gateway.upstream.Attempt` (its
    request's tokens) write it."""

    id: str
    url: str
    pool: str
    model: str
    max_num_seqs: int
    ready: bool = False
    metrics: EngineMetrics | None = None
    metrics_at: float | None = None
    in_flight: int = 0
    prefill_tokens: int = 0  # `EndpointView.prefill_tokens`: open requests' prompt tokens still to prefill
    context_tokens: int = 0  # and those of open requests the replica has answered
    failures: int = 0  # consecutive replica faults
    ejections: int = 0  # consecutive ejections (sets the backoff)
    ejected_until: float = 0.0
    served: int = field(default=0)
    lora: bool = False  # its pool declares LoRA adapters: the probe also reads /v1/models, until it has
    adapters: frozenset[str] | None = None  # the adapters its /v1/models lists; None until read

    def view(self, now: float) -> EndpointView:
        m = self.metrics
        return EndpointView(
            id=self.id,
            url=self.url,
            pool=self.pool,
            model=self.model,
            ready=self.ready,
            ejected=now < self.ejected_until,
            metrics_age_s=None if self.metrics_at is None else now - self.metrics_at,
            running=m.running if m else 0.0,
            waiting=m.waiting if m else 0.0,
            kv_usage=m.kv_usage if m else 0.0,
            in_flight=self.in_flight,
            max_num_seqs=self.max_num_seqs,
            prefill_tokens=self.prefill_tokens,
            context_tokens=self.context_tokens,
            adapters=self.adapters or frozenset(),
            active_adapters=m.lora_active if m else frozenset(),
        )


class EndpointSet:
    """All pools' replicas. ``on_change(pool)`` runs whenever a pool's routable count may have changed."""

    def __init__(
        self,
        pools: Sequence[PoolSpec],
        clock: Clock,
        outlier: OutlierPolicy | None = None,
        on_change: Callable[[str], None] | None = None,
        on_eject: Callable[[Endpoint, float], None] | None = None,
    ) -> None:
        self.pools = {p.name: p for p in pools}
        self._clock = clock
        self.outlier = outlier or OutlierPolicy()
        self._members: dict[str, dict[str, Endpoint]] = {p.name: {} for p in pools}
        self._on_change = on_change or (lambda pool: None)
        self._on_eject = on_eject or (lambda ep, s: None)

    def members(self, pool: str) -> list[Endpoint]:
        return list(self._members[pool].values())

    def set_members(self, pool: str, replicas: Sequence[tuple[str, str, bool | None]]) -> None:
        """Replace pool membership with (id, url, ready) triples; ready None keeps the probe's verdict."""
        spec = self.pools[pool]
        old = self._members[pool]
        new: dict[str, Endpoint] = {}
        for rid, url, ready in replicas:
            ep = old.get(rid)
            if ep is None or ep.url != url:
                ep = Endpoint(
                    rid, url.rstrip("/"), pool, spec.served_name, spec.engine.max_num_seqs, lora=bool(spec.adapters)
                )
            if ready is not None:
                ep.ready = ready
            new[rid] = ep
        self._members[pool] = new
        self._on_change(pool)

    def snapshot(self, pool: str) -> list[EndpointView]:
        now = self._clock.monotonic()
        return [ep.view(now) for ep in self._members[pool].values()]

    def routable(self, pool: str) -> int:
        now = self._clock.monotonic()
        return sum(1 for ep in self._members[pool].values() if ep.ready and now >= ep.ejected_until)

    def get(self, pool: str, rid: str) -> Endpoint | None:
        return self._members[pool].get(rid)

    def find(self, rid: str) -> Endpoint | None:
        """The member ``rid`` of whichever pool it belongs to (a replica id names one replica in one pool)."""
        for members in self._members.values():
            if rid in members:
                return members[rid]
        return None

    @contextlib.contextmanager
    def lease(self, view: EndpointView) -> Iterator[Endpoint]:
        """Count one request on the replica behind ``view`` (a router's pick from `snapshot`) until the block ends.

        The replica stays leased even if membership changes meanwhile: the request runs to its end on it.
        KeyError when the replica is no longer a member (take ``view`` from a snapshot with no await since).
        """
        ep = self._members[view.pool][view.id]
        ep.in_flight += 1
        try:
            yield ep
        finally:
            ep.in_flight -= 1

    def set_ready(self, ep: Endpoint, ready: bool) -> None:
        if ep.ready != ready:
            ep.ready = ready
            self._on_change(ep.pool)

    def succeeded(self, ep: Endpoint) -> None:
        ep.failures = 0
        if ep.ejections and self._clock.monotonic() > ep.ejected_until + self.outlier.max_s:
            ep.ejections = 0

    def failed(self, ep: Endpoint, *, eject_now: bool = False) -> bool:
        """Count a replica fault; True when it got the replica ejected."""
        ep.failures += 1
        if not eject_now and ep.failures < self.outlier.consecutive_failures:
            return False
        now = self._clock.monotonic()
        members = self._members[ep.pool].values()
        ejected = sum(1 for other in members if now < other.ejected_until)
        if now < ep.ejected_until or not self.outlier.may_eject(len(self._members[ep.pool]), ejected):
            return False
        ep.ejections += 1
        backoff = self.outlier.backoff(ep.ejections)
        ep.ejected_until = now + backoff
        ep.failures = 0
        log.warning("ejected replica %s of pool %s for %.1fs", ep.id, ep.pool, backoff)
        self._on_eject(ep, backoff)
        self._on_change(ep.pool)
        return True


class Refresher:
    """The background loop that keeps an `EndpointSet` current. Call `refresh_once` or run `run` as a task."""

    def __init__(
        self,
        endpoints: EndpointSet,
        session: aiohttp.ClientSession,
        static: Mapping[str, Sequence[str]],
        control_plane: str | None,
        interval_s: float,
        timeout_s: float,
        kv_feed: KvEventFeed | None = None,
        static_kv: Mapping[str, Sequence[str]] | None = None,
        credential: ClientCredential | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.credential = credential  # on discovery reads (the control plane's only): None sends none
        self.kv_feed = kv_feed  # told each pool's ready replicas' KV event sockets after every discovery
        self._static_kv = static_kv or {}
        self._session = session
        self._static = static
        self._cp = control_plane.rstrip("/") if control_plane else None
        self.interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.rounds = 0
        self._slow: dict[str, int] = {}  # endpoint id -> consecutive health probes that timed out

    async def run(self) -> None:
        while True:
            await self.refresh_once()
            await asyncio.sleep(self.interval_s)

    async def refresh_once(self) -> None:
        for pool in self.endpoints.pools:
            if self._cp is not None:
                await self._discover(pool)
            elif self.rounds == 0:
                urls = self._static.get(pool, [])
                self.endpoints.set_members(pool, [(static_replica_id(pool, i), u, None) for i, u in enumerate(urls)])
                if self.kv_feed is not None:
                    kv = self._static_kv.get(pool, [])
                    static = {static_replica_id(pool, i): u for i, u in enumerate(kv[: len(urls)])}
                    self.kv_feed.sync(pool, static, any_topic=True)
        probes = [self._probe(ep) for pool in self.endpoints.pools for ep in self.endpoints.members(pool)]
        await asyncio.gather(*probes)
        self.rounds += 1
        for pool in self.endpoints.pools:
            self.endpoints._on_change(pool)

    async def _discover(self, pool: str) -> None:
        url = f"{self._cp}/v1/pools/{pool}/replicas"
        try:  # a token file that cannot be read (OSError) is an outage of this round, as the control plane's is
            headers = self.credential.headers() if self.credential is not None else None
            async with self._session.get(url, timeout=self._timeout, headers=headers) as resp:
                resp.raise_for_status()
                listing = ReplicaList.model_validate_json(await resp.read())
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.warning("control plane unreachable (%s): keeping %s's last known replicas", exc, pool)
            return
        self.endpoints.set_members(
            pool, [(r.replica, r.engine_url, r.state == "ready" and not r.stale) for r in listing.replicas]
        )
        if self.kv_feed is not None:  # only ready replicas are routed to: the others' blocks are not followed
            ready = {r.replica: r.last_report.kv_events_url for r in listing.replicas if r.state == "ready"}
            self.kv_feed.sync(pool, ready)

    async def _probe(self, ep: Endpoint) -> None:
        # Which adapters it serves (a replica started before an adapter was added lacks it): read once, since the
        # engine's adapters are its command line's, fixed for the life of this endpoint (a new URL is a new one).
        if ep.lora and ep.adapters is None:
            models = await self._get(ep.url + "/v1/models")
            if isinstance(models, str):
                ep.adapters = served_adapters(models, ep.model)
        health, metrics = await asyncio.gather(self._get(ep.url + "/health"), self._get(ep.url + "/metrics"))
        samples = None  # the scrape's load series, parsed once; None when absent or malformed
        if isinstance(metrics, str):
            with contextlib.suppress(ValueError):
                samples = parse(load_lines(metrics))
        if self._cp is None:
            asleep = samples is not None and engine_asleep(samples)
            self.endpoints.set_ready(ep, self._healthy(ep, health) and not asleep)
        if samples is not None:
            with contextlib.suppress(KeyError):
                ep.metrics = EngineMetrics.from_samples(samples)
                ep.metrics_at = self.endpoints._clock.monotonic()

    def _healthy(self, ep: Endpoint, health: str | None | _TimedOut) -> bool:
        """A static replica's readiness from its health probe: an answer other than 200 or a refused connection
        takes it out at once, but a probe that only timed out does so after `SLOW_PROBES` in a row. An engine
        whose API server is starved (vLLM on a saturated CPU, the last replica after a drain taking every stream)
        answers late, not wrongly: one late probe emptied the pool and failed every request for a round."""
        if not isinstance(health, _TimedOut):
            self._slow.pop(ep.id, None)
            return health is not None
        self._slow[ep.id] = self._slow.get(ep.id, 0) + 1
        return self._slow[ep.id] < SLOW_PROBES and ep.ready  # a late probe never brings one in

    async def _get(self, url: str) -> str | None | _TimedOut:
        """The body of a 200, None for any other answer or a failed connection, `TIMED_OUT` past the timeout."""
        try:
            async with self._session.get(url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    return None
                return await resp.text()
        except TimeoutError:  # aiohttp's ServerTimeoutError is one too: connected or not, no answer in time
            return TIMED_OUT
        except aiohttp.ClientError:
            return None


class _TimedOut:
    """A probe that got no answer within its timeout."""


TIMED_OUT = _TimedOut()
SLOW_PROBES = 3  # health probes in a row that time out before a static replica leaves rotation


# The series routing reads; everything else in a scrape (dozens of histograms) is skipped before parsing, which
# keeps a scrape from blocking the event loop for milliseconds.
_LOAD_SERIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting{",
    "vllm:num_requests_waiting ",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:lora_requests_info",
    "vllm:engine_sleep_state{",  # asleep or awake (`engine_asleep`)
)


def load_lines(text: str) -> str:
    """The lines of a ``/metrics`` scrape that `EngineMetrics` needs for load (TTFT buckets are left out), and the
    engine's sleep state."""
    return "\n".join(line for line in text.splitlines() if line.startswith(_LOAD_SERIES))


def static_replica_id(pool: str, index: int) -> str:
    """The name of a pool's ``index``-th static engine URL: names, not addresses, reach clients and logs."""
    return f"{pool}-static-{index}"


def served_adapters(models_json: str, base: str) -> frozenset[str] | None:
    """The adapters an engine's ``/v1/models`` lists on ``base`` (cards whose ``parent`` is the base model); None
    for an answer that is not a model list (read again next probe)."""
    try:
        cards = json.loads(models_json).get("data", [])
        return frozenset(c["id"] for c in cards if isinstance(c, dict) and c.get("parent") == base and "id" in c)
    except (ValueError, AttributeError, TypeError):
        return None
