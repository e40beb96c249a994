"""Engine client: the agent's HTTP calls to its own engine (health, warm-up, metrics, version, and with sleep mode
sleep, wake and the greedy check that follows every wake).

Every call has a short timeout and maps transport failures to values the supervisor branches on, never to
exceptions it must string-match: ``connection refused`` is `Health.REFUSED` (vLLM binds its port but does not
listen while loading, so refused means "still starting"), anything else not 200 is `Health.UNHEALTHY`.

What ``/version`` answers is held against the pool's pinned ``engine.version`` by `version_matches` (pure): the
agent builds the engine's flags for the pinned release, so an engine of another one may refuse a flag, ignore one,
or log its start in other words (`agent.engine_log`). Releases are compared without a PEP 440 local label: vLLM's
CPU build answers ``0.32.0`` on ``/version`` and prints ``0.32.0+cpu`` for ``vllm --version``, release ``0.32.0``.
"""

from __future__ import annotations

import enum
from typing import Protocol

import httpx

__all__ = [
    "CHECK_MAX_TOKENS",
    "CHECK_PROMPT",
    "EngineClient",
    "Health",
    "HttpEngineClient",
    "check_body",
    "release",
    "version_matches",
]


class Health(enum.Enum):
    OK = "ok"  # 200
    REFUSED = "refused"  # nothing listening: loading (or gone)
    UNHEALTHY = "unhealthy"  # non-200, timeout, reset


class EngineClient(Protocol):
    async def health(self) -> Health: ...

    async def warm_up(self) -> bool:
        """One short completion; True when it returned 200 with a choice."""

    async def metrics(self) -> str:
        """The ``/metrics`` text; raises httpx.HTTPError (or ValueError) when it cannot be had."""

    async def version(self) -> str | None: ...

    async def sleep(self, level: int) -> bool:
        """``POST /sleep?level=L`` (vLLM 0.33, ``VLLM_SERVER_DEV_MODE=1``); True once the engine answered asleep."""

    async def wake_up(self) -> bool:
        """``POST /wake_up`` with no tags (everything); True once the engine answered fully awake."""

    async def check(self) -> str | None:
        """The `CHECK` completion's text (greedy, fixed prompt and length); None when it failed."""


CHECK_PROMPT = "The capital of France is"
CHECK_MAX_TOKENS = 16


def check_body(model: str) -> dict[str, object]:
    """The greedy check request: temperature 0, a fixed prompt and a fixed length, nothing else that could vary."""
    return {"model": model, "prompt": CHECK_PROMPT, "max_tokens": CHECK_MAX_TOKENS, "temperature": 0.0, "seed": 0}


class HttpEngineClient:
    """`EngineClient` over an injected ``httpx.AsyncClient`` (tests pass a MockTransport or a real engine)."""

    def __init__(
        self, client: httpx.AsyncClient, base_url: str, served_model: str, probe_timeout_s: float = 5.0
    ) -> None:
        self._client = client
        self.base_url = base_url.rstrip("/")
        self._model = served_model
        self._timeout = probe_timeout_s

    async def health(self) -> Health:
        try:
            response = await self._client.get(f"{self.base_url}/health", timeout=self._timeout)
        except httpx.ConnectError:
            return Health.REFUSED
        except httpx.HTTPError:
            return Health.UNHEALTHY
        return Health.OK if response.status_code == 200 else Health.UNHEALTHY

    async def warm_up(self) -> bool:
        body = {"model": self._model, "prompt": "Hello", "max_tokens": 1, "temperature": 0.0}
        try:
            response = await self._client.post(
                f"{self.base_url}/v1/completions", json=body, timeout=max(30.0, self._timeout)
            )
            return response.status_code == 200 and bool(response.json().get("choices"))
        except (httpx.HTTPError, ValueError):
            return False

    async def metrics(self) -> str:
        response = await self._client.get(f"{self.base_url}/metrics", timeout=self._timeout)
        response.raise_for_status()
        return response.text

    async def version(self) -> str | None:
        try:
            response = await self._client.get(f"{self.base_url}/version", timeout=self._timeout)
            if response.status_code == 200:
                value = response.json().get("version")
                return str(value) if value else None
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        return None

    async def sleep(self, level: int) -> bool:
        # The level goes in the query: vLLM 0.33 ignores a JSON body (and a sleep_level parameter), giving level 1.
        return await self._post_status(f"/sleep?level={level}", "sleeping")

    async def wake_up(self) -> bool:
        return await self._post_status("/wake_up", "awake")

    async def _post_status(self, path: str, status: str) -> bool:
        try:
            # A first level-1 sleep pins host memory for the weights: tens of seconds on large models.
            response = await self._client.post(f"{self.base_url}{path}", timeout=max(120.0, self._timeout))
            return response.status_code == 200 and response.json().get("status") == status
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    async def check(self) -> str | None:
        try:
            response = await self._client.post(
                f"{self.base_url}/v1/completions", json=check_body(self._model), timeout=max(30.0, self._timeout)
            )
            if response.status_code != 200:
                return None
            text = response.json()["choices"][0]["text"]
            return text if isinstance(text, str) else None
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return None


def release(version: str) -> str:
    """``0.32.0+cpu`` -> ``0.32.0``: the version without its local label (after ``+``) or a leading ``v``."""
    return version.strip().partition("+")[0].removeprefix("v")


def version_matches(reported: str | None, pinned: str) -> bool | None:
    """None while the engine has not said (no ``/version`` answer since its launch); else whether the releases
    are the same."""
    return None if reported is None else release(reported) == release(pinned)
