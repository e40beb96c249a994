"""FailoverQuota over a real redis-server that the tests kill and restart: local share, 503, probing, recovery."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from gateway.errors import QuotaExceeded, QuotaStoreUnavailable
from gateway.metrics import GatewayMetrics
from gateway.quota import QuotaLimits, Reservation
from gateway.quota.failover import FailoverQuota, Mode, local_share
from gateway.quota.memory import MemoryQuota
from gateway.quota.redis import RedisQuota
from tests.gateway.builders import ManualClock
from tests.gateway.quota.conftest import RedisServer
from tests.support.wait import async_wait_for

pytestmark = pytest.mark.redis

ROOMY = {"requests_per_second": 1000.0, "tokens_per_minute": 1_000_000}


@contextlib.asynccontextmanager
async def failover(
    url: str, clock: ManualClock, mode: Mode = "fail-open", gateways: int = 2
) -> AsyncIterator[FailoverQuota]:
    backend = FailoverQuota(
        RedisQuota.from_url(url, lease_s=60),
        MemoryQuota(clock, lease_s=60),
        mode=mode,
        gateways=gateways,
        clock=clock,
    )
    try:
        yield backend
    finally:
        await backend.close()


def _series(metrics: GatewayMetrics) -> dict[str, float]:
    lines = metrics.render().decode().splitlines()
    pairs = (line.rsplit(" ", 1) for line in lines if line.startswith("llmfleet_gateway_quota_store"))
    return {name: float(value) for name, value in pairs}


@pytest.mark.parametrize(
    ("limits", "gateways", "expected"),
    [
        (QuotaLimits(10.0, 600, 8), 1, QuotaLimits(10.0, 600, 8)),
        (QuotaLimits(10.0, 600, 8), 2, QuotaLimits(5.0, 300, 4)),
        (QuotaLimits(10.0, 600, 7), 3, QuotaLimits(10 / 3, 200, 2)),
        (QuotaLimits(1.0, 2, 1), 4, QuotaLimits(0.25, 1, 1)),
    ],
    ids=["one-gateway-keeps-all", "halves", "rounds-down", "at-least-one"],
)
def test_local_share_divides_each_limit(limits: QuotaLimits, gateways: int, expected: QuotaLimits) -> None:
    assert local_share(limits, gateways) == expected


async def test_fail_open_counts_a_local_share_while_down_and_uses_redis_once_it_answers(
    redis_server: RedisServer,
) -> None:
    clock, metrics = ManualClock(100.0), GatewayMetrics()
    limits = QuotaLimits(**ROOMY, max_concurrency=4)
    async with failover(redis_server.url, clock) as quota:
        metrics.watch_quota(quota)
        await quota.acquire("t", limits, "r1", 1)
        assert _series(metrics)["llmfleet_gateway_quota_store_up"] == 1

        redis_server.kill()
        local = [await quota.acquire("t", limits, f"l{i}", 1) for i in range(2)]  # this gateway's share: 4 / 2
        with pytest.raises(QuotaExceeded, match="maxConcurrency"):
            await quota.acquire("t", limits, "l2", 1)
        await quota.release(local[0], used_tokens=1)
        await quota.acquire("t", limits, "l3", 1)
        assert _series(metrics) == {
            "llmfleet_gateway_quota_store_up": 0,
            'llmfleet_gateway_quota_store_down_requests_total{decision="local"}': 4,
            'llmfleet_gateway_quota_store_down_requests_total{decision="refused"}': 0,
        }

        redis_server.start()  # empty: nothing was saved
        with pytest.raises(QuotaExceeded):  # within a second of the failure: not probed yet, still the local share
            await quota.acquire("t", limits, "l4", 1)
        clock.now += 1.0
        taken = [await quota.acquire("t", limits, f"s{i}", 1) for i in range(4)]  # Redis again: the whole limit
        with pytest.raises(QuotaExceeded, match="maxConcurrency"):
            await quota.acquire("t", limits, "s4", 1)
        assert _series(metrics)["llmfleet_gateway_quota_store_up"] == 1
        for reservation in taken:
            await quota.release(reservation, used_tokens=1)
        await quota.acquire("t", limits, "s5", 1)


async def test_the_local_share_divides_by_the_gateways_the_control_plane_counts_while_that_count_is_fresh(
    redis_server: RedisServer,
) -> None:
    clock = ManualClock(100.0)
    limits = QuotaLimits(**ROOMY, max_concurrency=12)
    backend = FailoverQuota(
        RedisQuota.from_url(redis_server.url, lease_s=60),
        MemoryQuota(clock, lease_s=60),
        mode="fail-open",
        gateways=2,  # the stack deploys two
        clock=clock,
        peers_hold_s=5.0,
    )
    try:
        backend.peers(4)  # a rollout's surge: four report to the control plane
        redis_server.kill()
        held = [await backend.acquire("t", limits, f"a{i}", 1) for i in range(3)]  # 12 / 4
        with pytest.raises(QuotaExceeded, match="maxConcurrency"):
            await backend.acquire("t", limits, "a3", 1)
        assert backend.divisor() == 4
        clock.now += 5.5  # no answer from the control plane since: back to the configured count, 12 / 2
        assert backend.divisor() == 2
        held += [await backend.acquire("t", limits, f"b{i}", 1) for i in range(3)]
        with pytest.raises(QuotaExceeded, match="maxConcurrency"):
            await backend.acquire("t", limits, "b3", 1)
    finally:
        await backend.close()


async def test_fail_closed_refuses_with_503_while_down(redis_server: RedisServer) -> None:
    clock, metrics = ManualClock(100.0), GatewayMetrics()
    limits = QuotaLimits(**ROOMY, max_concurrency=4)
    async with failover(redis_server.url, clock, mode="fail-closed") as quota:
        metrics.watch_quota(quota)
        redis_server.kill()
        for i in range(3):
            with pytest.raises(QuotaStoreUnavailable) as info:
                await quota.acquire("t", limits, f"r{i}", 1)
            assert info.value.status == 503 and info.value.headers() == {"Retry-After": "1"}
        assert _series(metrics)['llmfleet_gateway_quota_store_down_requests_total{decision="refused"}'] == 3
        redis_server.start()
        clock.now += 1.0
        await quota.acquire("t", limits, "after", 1)
        assert quota.health().up


class SilentStore:
    """A loopback port that accepts connections and never answers: ``hold`` keeps them open (a Redis that hangs),
    else closes them at once (one that drops them). ``accepted`` counts connections."""

    def __init__(self, hold: bool) -> None:
        self.hold = hold
        self.accepted = 0
        self._open: list[socket.socket] = []
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"

    def _serve(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = self._listener.accept()
                self.accepted += 1
                if self.hold:
                    self._open.append(conn)
                else:
                    conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._open:
            conn.close()
        self._listener.close()


@pytest.fixture
def dead_store() -> Iterator[SilentStore]:
    store = SilentStore(hold=False)
    yield store
    store.close()


@pytest.fixture
def hung_store() -> Iterator[SilentStore]:
    store = SilentStore(hold=True)
    yield store
    store.close()


async def test_a_dead_store_is_probed_at_most_once_per_interval(dead_store: SilentStore) -> None:
    clock = ManualClock(100.0)
    limits = QuotaLimits(**ROOMY, max_concurrency=1000)
    async with failover(dead_store.url, clock) as quota:
        await quota.acquire("t", limits, "first", 1)  # fails over on the first request
        assert not quota.health().up
        tried = dead_store.accepted
        assert tried >= 1
        await asyncio.gather(*(quota.acquire("t", limits, f"a{i}", 1) for i in range(50)))
        assert dead_store.accepted == tried  # within the interval: no call at all
        clock.now += 1.0
        await asyncio.gather(*(quota.acquire("t", limits, f"b{i}", 1) for i in range(50)))
        assert tried < dead_store.accepted <= tried + 2  # one PING (and its one retry) for 50 requests
        assert quota.health().decided_locally == 101


async def test_a_hung_store_costs_a_burst_one_timeout_and_a_few_connections(hung_store: SilentStore) -> None:
    clock = ManualClock(100.0)
    limits = QuotaLimits(**ROOMY, max_concurrency=1000)
    client = Redis.from_url(hung_store.url, socket_connect_timeout=0.3, socket_timeout=0.3)
    quota = FailoverQuota(
        RedisQuota(client), MemoryQuota(clock), mode="fail-open", gateways=1, clock=clock, max_in_flight=4
    )
    try:
        started = time.monotonic()
        await asyncio.gather(*(quota.acquire("t", limits, f"r{i}", 1) for i in range(40)))
        elapsed = time.monotonic() - started
    finally:
        await quota.close()
    # Four calls wait for Redis at once; when they time out, the 36 behind them see the outage and go local.
    assert hung_store.accepted <= 4 and elapsed < 1.5
    assert quota.health().decided_locally == 40


async def test_releases_redis_missed_are_settled_when_it_answers_again(redis_server: RedisServer) -> None:
    clock = ManualClock(100.0)
    limits = QuotaLimits(**ROOMY, max_concurrency=1)
    async with failover(redis_server.url, clock, gateways=1) as quota:
        held = await quota.acquire("t", limits, "held", 1)
        client = Redis.from_url(redis_server.url)
        await client.save()  # the restart below loads the open slot
        await client.aclose()
        redis_server.kill()
        await quota.release(held, used_tokens=1)  # Redis is gone: kept for later
        redis_server.start()
        clock.now += 1.0

        async def admitted() -> Reservation | None:
            with contextlib.suppress(QuotaExceeded):
                return await quota.acquire("t", limits, "next", 1)
            return None

        # Without the late release the saved slot would block the tenant until its 60 s lease ran out.
        await async_wait_for(admitted, timeout_s=3, what="the saved slot released", ignore=())
        assert quota.health().up
