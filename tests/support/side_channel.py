"""Side channel: the prefix-cache timing attack played through a gateway, and how well it tells a guess apart.

The attacker (tenant B) wants to know whether tenant A's prompt starts with a secret it guesses. It sends the guess
and times the first token: a prefix the engine has cached skips its prefill, so a right guess answers sooner,
unless the gateway's per-tenant ``cache_salt`` keeps B's blocks apart from A's.

**One trial** (`attack`): a fresh secret, never sent before; A sends it once (the engine caches it under A's salt);
B then sends the right guess once and ``wrong`` fresh wrong guesses of the same shape (drawn from the same
generator), in a seeded random order, timing each one's first token. Every guess is new to B's own cache too (a
right guess B has sent once would hit B's own blocks next time, so no secret is guessed twice), so a guess is
served from cache only where A's blocks are B's: the separate tenants' right and wrong guesses are exchangeable
and their AUC is 0.5 up to sampling noise, exactly.

**The measure**: ROC AUC = P(TTFT of a wrong guess > TTFT of the right one), ties counted half (the Mann-Whitney
U statistic over n_right x n_wrong pairs). 1.0: every right guess answered sooner than every wrong one. Under the
null its standard deviation is ``sqrt((n_right + n_wrong + 1) / (12 n_right n_wrong))`` (`null_auc_sd`), which
sizes the tests' band around 0.5.

The tenants (`TENANTS`, `KEYS`): ``a-solo`` and ``b-solo`` have salts of their own (the default); ``a-team`` and
``b-team`` share one ``cacheGroup``, which opens the channel again, on purpose.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from fleet.protocol.keys import hash_api_key

__all__ = ["KEYS", "TENANTS", "Trials", "attack", "first_token_s", "null_auc_sd", "roc_auc", "secret_text"]

KEYS = {name: f"sk-side-channel-{name}" for name in ("a-solo", "b-solo", "a-team", "b-team")}
TENANTS: list[dict[str, Any]] = [
    {
        "name": name,
        "apiKeyHashes": [hash_api_key(key)],
        "priority": 5,
        "requestsPerSecond": 10000,
        "tokensPerMinute": 100_000_000,
        "maxConcurrency": 10000,
        **({"cacheGroup": "team"} if name.endswith("-team") else {}),
    }
    for name, key in KEYS.items()
]
QUESTION = "Summarise the instructions above in one sentence."
# Plain words the tiny tokenizer and the simulator's both split predictably; a secret is a seeded draw of them.
_WORDS = (
    "harbour tide vessel anchor current compass signal weather storm reef lantern chart keel rudder sail mast "
    "crew cargo voyage island coast beacon fog swell gale bearing depth channel dock pilot ledger invoice "
    "account balance payment client contract clause policy review audit report figure margin quarter budget"
).split()


def secret_text(rng: random.Random, words: int) -> str:
    """A prompt of ``words`` words drawn from a fixed vocabulary, each with a number (a secret, or a guess)."""
    return " ".join(f"{rng.choice(_WORDS)} {rng.randrange(100)}" for _ in range(words))


def roc_auc(right: Sequence[float], wrong: Sequence[float]) -> float:
    """P(wrong > right) + P(wrong == right) / 2 over every pair: how well a threshold on the TTFT tells a right
    guess (faster when it hits the cache) from a wrong one; 0.5 = not at all."""
    if not right or not wrong:
        raise ValueError("the AUC needs right and wrong samples")
    above = sum((w > r) + 0.5 * (w == r) for r in right for w in wrong)
    return above / (len(right) * len(wrong))


def null_auc_sd(n_right: int, n_wrong: int) -> float:
    """The AUC's standard deviation when right and wrong guesses are exchangeable (no channel), without ties."""
    return math.sqrt((n_right + n_wrong + 1) / (12.0 * n_right * n_wrong))


@dataclass(frozen=True)
class Trials:
    """First-token times (seconds) of the right guesses and of the wrong ones."""

    right: tuple[float, ...]
    wrong: tuple[float, ...]

    @property
    def auc(self) -> float:
        return roc_auc(self.right, self.wrong)

    @property
    def band(self) -> float:
        """4 standard deviations of the AUC under the null, for these sample counts."""
        return 4.0 * null_auc_sd(len(self.right), len(self.wrong))

    def summary(self) -> str:
        right, wrong = statistics.median(self.right) * 1000, statistics.median(self.wrong) * 1000
        return (
            f"AUC {self.auc:.3f} over {len(self.right)} right x {len(self.wrong)} wrong guesses "
            f"(null band 0.5 +/- {self.band:.3f}); TTFT p50 right {right:.1f} ms, wrong {wrong:.1f} ms"
        )


async def first_token_s(
    session: aiohttp.ClientSession, url: str, key: str, model: str, system: str, max_tokens: int = 2
) -> float:
    """Seconds from sending a streamed chat (``system`` then `QUESTION`) to its first chunk that carries content
    (vLLM's and the simulator's first chunk carries the role with an empty content, sent once prefill is done);
    the stream is read to its end."""
    body = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    first: float | None = None
    started = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if first is None and line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if "content" in (choices[0].get("delta") or {}):
                    first = time.perf_counter() - started
    assert first is not None, "the stream carried no content"
    return first


async def attack(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    *,
    victim: str,
    attacker: str,
    trials: int,
    wrong: int,
    words: int,
    seed: int,
) -> Trials:
    """``trials`` trials (see the module docstring) of tenant ``attacker`` guessing tenant ``victim``'s secrets
    (keys of `KEYS`) through the gateway at ``url``, each with one right and ``wrong`` wrong guesses."""
    rng = random.Random(seed)
    right_s: list[float] = []
    wrong_s: list[float] = []
    for _ in range(trials):
        secret = secret_text(rng, words)
        await first_token_s(session, url, KEYS[victim], model, secret)
        guesses = [(True, secret), *((False, secret_text(rng, words)) for _ in range(wrong))]
        rng.shuffle(guesses)
        for is_right, guess in guesses:
            seconds = await first_token_s(session, url, KEYS[attacker], model, guess)
            (right_s if is_right else wrong_s).append(seconds)
    return Trials(tuple(right_s), tuple(wrong_s))
