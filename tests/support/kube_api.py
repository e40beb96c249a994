"""A loopback Kubernetes API server keeping coordination.k8s.io/v1 Lease objects the way the real one does
(label selectors, resourceVersion checks), for the stores that persist state as Leases."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from aiohttp import web

__all__ = ["FakeApiServer", "fake_api_server"]


class FakeApiServer:
    """Lease objects in one namespace: list (label selectors of ``k=v`` terms), create, replace, delete."""

    def __init__(self, namespace: str) -> None:
        self.prefix = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.leases: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.verbs: set[str] = set()

    def _stamp(self, lease: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        lease["metadata"]["resourceVersion"] = str(self.version)
        return lease

    async def handle(self, request: web.Request) -> web.Response:
        if not request.path.startswith(self.prefix):
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        name = request.path[len(self.prefix) + 1 :]
        body = await request.json() if request.can_read_body else None
        if request.method == "GET" and not name:
            self.verbs.add("list")
            terms = [t.split("=", 1) for t in request.query.get("labelSelector", "").split(",") if t]
            items = [
                lease
                for lease in self.leases.values()
                if all(lease["metadata"].get("labels", {}).get(k) == v for k, v in terms)
            ]
            return web.json_response({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1", "items": items})
        if request.method == "POST" and not name:
            self.verbs.add("create")
            assert body["apiVersion"] == "coordination.k8s.io/v1" and body["kind"] == "Lease"
            if body["metadata"]["name"] in self.leases:
                return web.json_response({"kind": "Status", "reason": "AlreadyExists", "code": 409}, status=409)
            self.leases[body["metadata"]["name"]] = self._stamp(body)
            return web.json_response(body, status=201)
        if request.method == "PUT" and name in self.leases:
            self.verbs.add("update")
            if body["metadata"].get("resourceVersion") != self.leases[name]["metadata"]["resourceVersion"]:
                return web.json_response({"kind": "Status", "reason": "Conflict", "code": 409}, status=409)
            self.leases[name] = self._stamp(body)
            return web.json_response(body)
        if request.method == "DELETE":
            self.verbs.add("delete")
            if self.leases.pop(name, None) is None:
                return web.json_response({"kind": "Status", "code": 404}, status=404)
            return web.json_response({"kind": "Status", "status": "Success"})
        return web.json_response({"kind": "Status", "code": 405}, status=405)


@contextlib.asynccontextmanager
async def fake_api_server(namespace: str) -> AsyncIterator[tuple[FakeApiServer, httpx.AsyncClient]]:
    """A `FakeApiServer` for ``namespace`` on a free loopback port, and a client whose base URL is it."""
    server = FakeApiServer(namespace)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{runner.addresses[0][1]}", timeout=5) as client:
            yield server, client
    finally:
        await runner.cleanup()
