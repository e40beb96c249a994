"""Engine client: the agent's HTTP calls to its own engine (health, warm-up, metrics, version).

Every call has a short timeout and maps transport failures to values the supervisor branches on, never to
exceptions it must string-match: ``connection refused`` is `Health.REFUSED` (vLLM binds its port but does not
listen while loading, so refused means "still starting"), anything else not 200 is `Health.UNHEALTHY`.
"""

from __future__ import annotations

import enum
from typing import Protocol

import httpx

__all__ = ["EngineClient", "Health", "HttpEngineClient"]


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
