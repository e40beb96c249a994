"""A small real control-plane receiver (aiohttp on loopback) implementing the reports and lease contract."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from fleet.protocol.wire import LeaseGrant, LeaseRequest, LoadReport


@dataclass
class Receiver:
    max_unavailable: int = 1
    fail_with: int | None = None  # answer every request with this status
    reports: list[LoadReport] = field(default_factory=list)
    holders: dict[str, set[str]] = field(default_factory=dict)
    max_seen_holders: int = 0
    runner: web.AppRunner | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/reports", self.post_report)
        app.router.add_post("/v1/leases/restart", self.post_lease)
        app.router.add_delete("/v1/leases/restart/{pool}/{replica}", self.delete_lease)
        return app

    def _failure(self) -> web.Response | None:
        if self.fail_with is None:
            return None
        return web.json_response(
            {"error": {"message": "injected", "type": "x", "code": self.fail_with}}, status=self.fail_with
        )

    async def post_report(self, request: web.Request) -> web.Response:
        if (failure := self._failure()) is not None:
            return failure
        self.reports.append(LoadReport.model_validate(await request.json()))
        return web.json_response({"ok": True}, status=202)

    async def post_lease(self, request: web.Request) -> web.Response:
        if (failure := self._failure()) is not None:
            return failure
        lease = LeaseRequest.model_validate(await request.json())
        held = self.holders.setdefault(lease.pool, set())
        if lease.replica not in held and len(held) >= self.max_unavailable:
            return web.json_response({"error": {"message": "busy", "type": "conflict", "code": 409}}, status=409)
        held.add(lease.replica)
        self.max_seen_holders = max(self.max_seen_holders, len(held))
        grant = LeaseGrant(pool=lease.pool, replica=lease.replica, expires_at=time.time() + 60, holders=sorted(held))
        return web.json_response(grant.model_dump(mode="json"))

    async def delete_lease(self, request: web.Request) -> web.Response:
        held = self.holders.setdefault(request.match_info["pool"], set())
        if request.match_info["replica"] not in held:
            return web.json_response({"error": {"message": "no lease", "type": "x", "code": 404}}, status=404)
        held.discard(request.match_info["replica"])
        return web.Response(status=204)

    async def start(self, port: int = 0) -> None:
        self.runner = web.AppRunner(self.app(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def last(self) -> dict[str, Any]:
        return self.reports[-1].model_dump()
