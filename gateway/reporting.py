"""Reporting: push each pool's admission queue and request rate to the control plane in the background.

    gateway -> control plane   POST /v1/gateway-reports   fleet.protocol.wire.GatewayReport, one per pool, every
                                                          controlPlane.reportIntervalS
                               <- 200                     fleet.protocol.wire.GatewayAccepted: this gateway's share of
                                                          the pool's admission capacity (`gateway.shares`)

Requests waiting in the gateway's admission queue are in no engine, so no agent reports them; without this the
autoscaler would see at most ``queue.perReplicaThreshold`` waiting per replica while hundreds wait here.

Each report also carries the pool's answers since the last report the control plane accepted
(`fleet.protocol.wire.PoolOutcomes`: counts by outcome, TTFT and TPOT bucket counts), which canary rollouts judge a
candidate pool by (`rollout.slis`); a report that fails leaves them for the next one, so none is lost or counted
twice.

Contract: the request path only bumps two integers (`PoolTraffic`); the reporter reads them, the `Admission`
gauges and a clock. It never blocks a request. A failed push (control plane down, 4xx/5xx, timeout) is logged
once per outage and retried with the shared exponential backoff (`fleet.protocol.push.Backoff`: interval x 2^(n-1) after
n failed rounds, at most ``max_backoff_s``); the gateway keeps serving. The control plane marks a gateway stale
after ``controlPlane.staleAfterS`` without a report. Rates are over a sliding window (``window_s``, default
10 s) so one second's Poisson noise does not reach the scaler.

Each push carries the gateway's control credential (`fleet.protocol.control_auth.ClientCredential` of kind ``gateway``):
the ``credential`` given, else the one the process environment holds (``$LLMFLEET_CONTROL_TOKEN`` or
``$LLMFLEET_CONTROL_TOKEN_FILE``), else none (a control plane running ``--auth none``).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import secrets
import socket
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from fleet.protocol.clock import Clock
from fleet.protocol.control_auth import ClientCredential, Kind
from fleet.protocol.push import Backoff, push_loop
from fleet.protocol.wire import LATENCY_EDGES_S, RATE_WINDOW_S, GatewayAccepted, GatewayReport, PoolOutcomes
from gateway.admission import Admission

__all__ = ["GatewayReporter", "PoolTraffic", "default_gateway_id"]

log = logging.getLogger("llmfleet.gateway.reporting")


def default_gateway_id() -> str:
    """A name unique per gateway process: host, pid and a short random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def _bucket(value_s: float) -> int:
    return bisect.bisect_left(LATENCY_EDGES_S, value_s)


@dataclass
class PoolTraffic:
    """Counters the request path bumps: requests that reached the pool's admission, and those admitted; and the
    answers (`answered`) since the last report the control plane accepted (`unreported`, `reported`)."""

    arrived: int = 0
    admitted: int = 0
    samples: deque[tuple[float, int, int]] = field(default_factory=deque)  # (t, arrived, admitted), oldest first
    ok: int = 0
    client_errors: int = 0
    errors: int = 0
    ttft: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_EDGES_S) + 1))
    tpot: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_EDGES_S) + 1))
    accepted: PoolOutcomes = field(default_factory=PoolOutcomes)  # the answers reports have carried so far

    def answered(self, status: int, ttft_s: float | None, tpot_s: float | None) -> None:
        """One answer of the pool: its status (5xx: an error; 4xx and 499: the client's), first-token time and
        time per output token when measured."""
        if status >= 500:
            self.errors += 1
        elif status >= 400:
            self.client_errors += 1
        else:
            self.ok += 1
        if ttft_s is not None:
            self.ttft[_bucket(ttft_s)] += 1
        if tpot_s is not None:
            self.tpot[_bucket(tpot_s)] += 1

    def unreported(self) -> PoolOutcomes:
        """The answers counted since `reported` was last called (all of them before)."""
        base = self.accepted
        return PoolOutcomes(
            ok=self.ok - base.ok,
            client_errors=self.client_errors - base.client_errors,
            errors=self.errors - base.errors,
            ttft=_minus(self.ttft, base.ttft),
            tpot=_minus(self.tpot, base.tpot),
        )

    def reported(self, sent: PoolOutcomes) -> None:
        """``sent`` (an `unreported` value) was accepted: the next report starts after it."""
        base = self.accepted
        self.accepted = PoolOutcomes(
            ok=base.ok + sent.ok,
            client_errors=base.client_errors + sent.client_errors,
            errors=base.errors + sent.errors,
            ttft=_plus(base.ttft, sent.ttft),
            tpot=_plus(base.tpot, sent.tpot),
        )

    def rates(self, now: float, window_s: float) -> tuple[float, float, float]:
        """(arrived/s, admitted/s, seconds covered) over the last ``window_s``; records a sample at ``now``."""
        self.samples.append((now, self.arrived, self.admitted))
        while len(self.samples) > 2 and now - self.samples[1][0] >= window_s:
            self.samples.popleft()
        t0, a0, d0 = self.samples[0]
        span = now - t0
        if span <= 0:
            return 0.0, 0.0, 0.0
        return (self.arrived - a0) / span, (self.admitted - d0) / span, span


class GatewayReporter:
    """Builds and pushes one `GatewayReport` per pool; ``run()`` repeats until cancelled."""

    def __init__(
        self,
        control_plane: str,
        session: aiohttp.ClientSession,
        admission: Mapping[str, Admission],
        traffic: Mapping[str, PoolTraffic],
        clock: Clock,
        interval_s: float = 1.0,
        gateway_id: str | None = None,
        window_s: float = RATE_WINDOW_S,
        max_backoff_s: float = 30.0,
        credential: ClientCredential | None = None,
        on_share: Callable[[str, float | None], None] = lambda pool, share: None,
        on_peers: Callable[[int], None] = lambda gateways: None,
    ) -> None:
        """``on_share(pool, share)`` receives the admission share each accepted report is answered with,
        ``on_peers(gateways)`` the count of gateways it was divided among."""
        self.on_share = on_share
        self.on_peers = on_peers
        self.credential = credential or ClientCredential.from_env(Kind.GATEWAY)
        self.url = control_plane.rstrip("/") + "/v1/gateway-reports"
        self.session = session
        self.admission = admission
        self.traffic = traffic
        self.clock = clock
        self.interval_s = interval_s
        self.gateway_id = gateway_id or default_gateway_id()
        self.window_s = window_s
        self.backoff = Backoff(interval_s, max_backoff_s)  # counts failed rounds
        self.pushed = 0  # reports the control plane accepted
        start = clock.monotonic()
        for counters in traffic.values():
            counters.samples.append((start, counters.arrived, counters.admitted))

    def reports(self) -> list[GatewayReport]:
        """One report per pool as of now (samples the rate windows)."""
        now, ts = self.clock.monotonic(), self.clock.time()
        out = []
        for pool, admission in self.admission.items():
            arrived, admitted, span = self.traffic[pool].rates(now, self.window_s)
            out.append(
                GatewayReport(
                    gateway=self.gateway_id,
                    pool=pool,
                    waiting=admission.waiting,
                    in_flight=admission.in_flight,
                    arrived_per_s=round(arrived, 4),
                    admitted_per_s=round(admitted, 4),
                    window_s=round(span, 3),
                    ts=ts,
                    demand=admission.demand(),
                    outcomes=self.traffic[pool].unreported(),
                )
            )
        return out

    async def push_once(self) -> bool:
        """Push every pool's report; True when all were accepted. Never raises for a network or HTTP failure."""
        timeout = aiohttp.ClientTimeout(total=max(0.5, min(2.0, 2 * self.interval_s)))
        ok = True
        for report in self.reports():
            try:
                async with self.session.post(
                    self.url,
                    data=report.model_dump_json(),
                    headers={"Content-Type": "application/json", **self._auth()},
                    timeout=timeout,
                ) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
                self.pushed += 1
                self.traffic[report.pool].reported(report.outcomes)
                accepted = _accepted(body)
                self.on_share(report.pool, None if accepted is None else accepted.admission_share)
                if accepted is not None and "gateways" in accepted.model_fields_set:
                    self.on_peers(accepted.gateways)
            except (aiohttp.ClientError, TimeoutError) as exc:
                if ok and self.backoff.failures == 0:
                    log.warning("gateway report to %s failed (%s); retrying with backoff", self.url, exc)
                ok = False
        if self.backoff.record(ok) and ok:
            log.info("gateway reports to %s accepted again", self.url)
        return ok

    def _auth(self) -> dict[str, str]:
        return self.credential.headers() if self.credential is not None else {}

    async def run(self, wake: asyncio.Event | None = None) -> None:
        """Push every ``interval_s`` (backing off while the control plane fails), and at once when ``wake`` is
        set (the gateway's `Gateway.cold`: a request waits for a pool with no ready replica)."""
        await push_loop(self.push_once, self.backoff, self.clock, wake)


def _minus(a: list[int], b: list[int]) -> list[int]:
    """Bucket counts ``a - b`` ([] when none are left: nothing measured)."""
    out = [x - y for x, y in zip(a, b, strict=True)] if b else list(a)
    return out if any(out) else []


def _plus(a: list[int], b: list[int]) -> list[int]:
    if not a or not b:
        return list(a or b)
    return [x + y for x, y in zip(a, b, strict=True)]


def _accepted(body: bytes) -> GatewayAccepted | None:
    """A control plane's answer to a report; None when it is not one (an older control plane's plain answer)."""
    try:
        return GatewayAccepted.model_validate_json(body)
    except ValueError:
        return None
