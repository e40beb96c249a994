"""A gateway told to stop while clients keep their connections: no client sees an error.

Two gateway processes behind a TCP balancer that sends new connections to the ready ones (as an NLB does), and
16 clients (the real ``openai`` client, retries off, so a reset would surface) sending request after request,
without pause, over their keep-alive connections: half of them short answers, half streams of about half a
second, some of which began before the stop and so told their client to keep the connection. SIGTERM to one
gateway: it fails readiness, answers ``Connection: close``, keeps listening while the balancer notices, and
exits once its connections are gone; every client's next request goes to the other gateway over a new
connection. Without the propagation delay (or with aiohttp's plain stop) some clients get "Server disconnected
without sending a response". A rolling restart does this to each gateway in turn, a new one starting on the
stopped one's ports before the next stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai

from tests.gateway.conftest import SimFactory, admin_url
from tests.support.balancer import Backend, Balancer
from tests.support.procs import Proc
from tests.support.stacks import KEYS, MODEL, write_stack
from tests.support.wait import async_wait_for

CLIENTS = 16
PROPAGATION_S = 1.5


class Clients:
    """``CLIENTS`` clients, each with its own connection pool, each sending one chat request after another."""

    def __init__(self, base_url: str) -> None:
        self.clients = [
            openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=KEYS["gold"], max_retries=0, timeout=20.0)
            for _ in range(CLIENTS)
        ]
        self.done = [0] * CLIENTS
        self.errors: list[str] = []
        self.stop = asyncio.Event()

    async def _loop(self, i: int) -> None:
        messages: list[Any] = [{"role": "user", "content": f"client {i}"}]
        while not self.stop.is_set():
            try:
                if i % 2:  # a stream of about half a second: some are under way when the stop begins
                    stream = await self.clients[i].chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=32, stream=True
                    )
                    async for _ in stream:
                        pass
                else:
                    await self.clients[i].chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
                self.done[i] += 1
            except openai.APIError as exc:
                self.errors.append(f"client {i} after {self.done[i]}: {exc!r} caused by {exc.__cause__!r}")

    def each_done_more_than(self, counts: list[int]) -> bool:
        return all(done > seen + 1 for done, seen in zip(self.done, counts, strict=True))

    async def run(self) -> None:
        await asyncio.gather(*(self._loop(i) for i in range(CLIENTS)))
        for client in self.clients:
            await client.close()


@dataclass
class Behind:
    """Two gateways behind the balancer, the clients sending through it, every one of them served once already;
    `start` launches a gateway on the stack and the simulator (``--port`` and ``--admin-port`` among ``extra``)."""

    gateways: list[Proc]
    backends: list[Backend]
    clients: Clients
    start: Callable[..., Proc]


@contextlib.asynccontextmanager
async def _behind_a_balancer(
    sims: SimFactory, gateway_procs: Callable[..., Proc], tmp_path: Path
) -> AsyncIterator[Behind]:
    (sim,) = sims([], time_scale=1.0, max_num_seqs=32)  # real time: a 32-token stream takes ~0.5 s
    stack = write_stack(tmp_path / "Pulumi.test.yaml", "gateway")

    def start(*extra: str) -> Proc:
        return gateway_procs(stack, [sim.url], "--drain-propagation", str(PROPAGATION_S), *extra)

    gateways = [start() for _ in range(2)]
    backends = [Backend(g.port, admin_url(g) + "/readyz") for g in gateways]
    balancer = await Balancer(backends).start()
    await async_wait_for(lambda: all(b.ready for b in backends), timeout_s=10.0, what="both gateways ready")
    clients = Clients(balancer.url)
    running = asyncio.create_task(clients.run())
    try:
        await async_wait_for(
            lambda: clients.each_done_more_than([0] * CLIENTS), timeout_s=30.0, what="every client served"
        )
        yield Behind(gateways, backends, clients, start)
    finally:
        clients.stop.set()
        await running
        await balancer.close()


async def _stop(gateway: Proc, clients: Clients) -> int:
    """SIGTERM ``gateway`` under the clients' load; its exit code, once every client was served again after it."""
    gateway.send(signal.SIGTERM)
    rc = await asyncio.to_thread(gateway.wait, 30.0)
    after_exit = list(clients.done)
    await async_wait_for(lambda: clients.each_done_more_than(after_exit), timeout_s=30.0, what="served after exit")
    return rc


async def test_gateways_restarted_in_turn_serve_every_kept_alive_client_without_an_error(
    sims: SimFactory, gateway_procs: Callable[..., Proc], tmp_path: Path
) -> None:
    codes = []
    async with _behind_a_balancer(sims, gateway_procs, tmp_path) as behind:
        for i, old in enumerate(list(behind.gateways)):
            codes.append(await _stop(old, behind.clients))
            behind.gateways[i] = behind.start(
                "--port", str(old.port), "--admin-port", str(urlsplit(admin_url(old)).port)
            )
            await async_wait_for(
                lambda b=behind.backends[i]: b.ready, timeout_s=10.0, what=f"gateway {i}'s replacement ready"
            )
        served = list(behind.clients.done)
        await async_wait_for(
            lambda: behind.clients.each_done_more_than(served), timeout_s=30.0, what="served after both"
        )
    assert codes == [0, 0]
    assert behind.clients.errors == [], behind.clients.errors[:5]
    assert all(b.seen_unready for b in behind.backends), "readiness never fell during a drain"


async def test_a_stopping_gateway_hands_every_kept_alive_client_to_the_other_without_an_error(
    sims: SimFactory, gateway_procs: Callable[..., Proc], tmp_path: Path
) -> None:
    async with _behind_a_balancer(sims, gateway_procs, tmp_path) as behind:
        stopping = behind.gateways[0]
        rc = await _stop(stopping, behind.clients)
    assert rc == 0, stopping.tail()
    assert behind.clients.errors == [], behind.clients.errors[:5]
    assert behind.backends[0].seen_unready, "readiness never fell during the drain"
    assert "draining" in stopping.text()
    assert behind.backends[1].connections >= CLIENTS, "the clients did not move to the other gateway"
