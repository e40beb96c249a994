"""The prefix-cache side channel, played as an attacker through a gateway process in front of a simulated engine.

Tenant B times the first token of guesses at tenant A's ~1,700-token secrets (`tests.support.side_channel`; the
simulator counts tokens with the tiny model's tokenizer, as the real engine's tier does). The simulator runs at a
quarter of its model's time (a miss prefills the secret in about 35 ms, a hit skips all but its last block): where
the tenants share a ``cacheGroup`` the right guess is told apart (AUC 1.0 in every run; the bound is 0.9); with the
default per-tenant salts it is not (AUC within 4 standard deviations of 0.5 for the sample counts, so a false
alarm is a 1-in-15,000 event). One engine, so routing cannot split A's and B's requests; one gateway whose stack
holds both pairs of tenants.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.gateway.conftest import SimFactory
from tests.support.procs import Procs
from tests.support.side_channel import KEYS, TENANTS, attack, first_token_s, secret_text
from tests.support.stacks import MODEL, write_stack
from tests.support.wait import async_wait_for

TRIALS, WRONG, WORDS = 48, 2, 420  # 48 right x 96 wrong guesses of ~1,700 tokens: the null band is 0.5 +/- 0.2


@pytest.fixture
async def gateway_url(sims: SimFactory, procs: Procs, tmp_path: Path) -> AsyncIterator[str]:
    (engine,) = sims(["--tokenizer", "models/llmfleet-tiny-tokenizer"], time_scale=4.0)
    overrides = {"tenants": TENANTS, "gateway.maxBodyBytes": 1_000_000}
    stack = write_stack(tmp_path / "Pulumi.side-channel.yaml", "gateway", **overrides)
    argv = ["gateway", "--stack", str(stack), "--port", "0", "--admin-port", "0", "--no-access-log"]
    gateway = procs.start([*argv, "--replica", engine.url], name="gateway")
    url = gateway.wait_url("listening on")
    async with aiohttp.ClientSession() as session:
        rng = random.Random(0)

        async def served() -> bool:  # until routable, then a few more: the first requests open connections
            try:
                await first_token_s(session, url, KEYS["a-solo"], MODEL, secret_text(rng, 8))
            except AssertionError:
                return False
            return True

        await async_wait_for(served, timeout_s=15, what="the gateway serves")
        for _ in range(3):
            await served()
    yield url


async def test_separate_tenants_cannot_tell_a_right_guess_and_a_shared_cache_group_can(gateway_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        apart = await attack(
            session, gateway_url, MODEL, victim="a-solo", attacker="b-solo", trials=TRIALS, wrong=WRONG,
            words=WORDS, seed=1,
        )  # fmt: skip
        grouped = await attack(
            session, gateway_url, MODEL, victim="a-team", attacker="b-team", trials=TRIALS, wrong=WRONG,
            words=WORDS, seed=2,
        )  # fmt: skip
    print(f"\nseparate tenants: {apart.summary()}\none cache group:  {grouped.summary()}")
    assert grouped.auc >= 0.9, grouped.summary()
    assert abs(apart.auc - 0.5) <= apart.band, apart.summary()
