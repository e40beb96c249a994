"""Control client: the agent's calls to the control plane (load reports and restart leases).

    POST   /v1/reports                          LoadReport          -> 2xx
    POST   /v1/leases/restart                   LeaseRequest        -> 200 LeaseGrant | 409 refused
    DELETE /v1/leases/restart/{pool}/{replica}                      -> 2xx (or 404: already expired)

Errors (retry decisions branch on the class):
    ControlPlaneUnavailable   connect error, timeout or 5xx: the control plane is down; retryable later
    LeaseRefused              409: the pool already has maxUnavailable replicas restarting; retry in the window
"""

from __future__ import annotations

import httpx

from fleet.protocol.wire import LeaseGrant, LeaseRequest, LoadReport

__all__ = ["ControlClient", "ControlPlaneUnavailable", "LeaseRefused"]


class ControlPlaneUnavailable(Exception):
    """The control plane did not answer usefully (retryable)."""


class LeaseRefused(Exception):
    """A restart lease was refused (409): someone else in the pool is restarting."""


class ControlClient:
    """Thin typed client; ``base_url`` None means no control plane (every call raises Unavailable)."""

    def __init__(self, client: httpx.AsyncClient, base_url: str | None, timeout_s: float = 2.0) -> None:
        self._client = client
        self.base_url = base_url.rstrip("/") if base_url else None
        self._timeout = timeout_s

    async def _send(self, method: str, path: str, body: dict[str, object] | None = None) -> httpx.Response:
        if self.base_url is None:
            raise ControlPlaneUnavailable("no control plane configured")
        try:
            response = await self._client.request(method, f"{self.base_url}{path}", json=body, timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise ControlPlaneUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ControlPlaneUnavailable(f"{method} {path}: HTTP {response.status_code}")
        return response

    async def report(self, report: LoadReport) -> None:
        response = await self._send("POST", "/v1/reports", report.model_dump(mode="json"))
        if response.status_code >= 400:
            # A 4xx is a contract bug, not an outage; surface it to the caller's log as unavailable.
            raise ControlPlaneUnavailable(f"report rejected: HTTP {response.status_code} {response.text[:200]}")

    async def acquire_lease(self, pool: str, replica: str, ttl_s: float | None) -> LeaseGrant:
        request = LeaseRequest(pool=pool, replica=replica, ttl_s=ttl_s)
        response = await self._send("POST", "/v1/leases/restart", request.model_dump(mode="json"))
        if response.status_code == 409:
            raise LeaseRefused(response.text[:200])
        if response.status_code != 200:
            raise ControlPlaneUnavailable(f"lease request: HTTP {response.status_code} {response.text[:200]}")
        try:
            return LeaseGrant.model_validate_json(response.content)
        except ValueError as exc:
            raise ControlPlaneUnavailable(f"lease grant unreadable: {exc}") from exc

    async def release_lease(self, pool: str, replica: str) -> None:
        response = await self._send("DELETE", f"/v1/leases/restart/{pool}/{replica}")
        if response.status_code >= 400 and response.status_code != 404:
            raise ControlPlaneUnavailable(f"lease release: HTTP {response.status_code}")
