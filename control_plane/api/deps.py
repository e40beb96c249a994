"""Dependencies: what every handler of the control plane's API takes from the app it serves in.

`create_app` keeps the `ControlPlane`, its metrics (`control_plane.api.metrics.series`) and the `ControlAuth` in
``app.state``; the handlers are module functions that read them through these, so no handler closes over the
objects of one app. Each is ``async``: FastAPI runs a plain function dependency in its thread pool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import cast

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from control_plane.plane import ControlPlane
from fleet.protocol.control_api import error_response
from fleet.protocol.control_auth import Caller, ControlAuth, Kind

__all__ = ["agent", "control_plane", "gateway", "operator", "plane", "reader", "unknown_pool"]


async def plane(request: Request) -> ControlPlane:
    """The control plane the app serves."""
    return cast(ControlPlane, request.app.state.plane)


def _require(*kinds: Kind) -> Callable[[Request], Awaitable[Caller | None]]:
    async def caller(request: Request) -> Caller | None:
        auth = cast(ControlAuth, request.app.state.auth)
        return await auth.require(*kinds)(request)

    return caller


# The caller of a write, once its credential is checked (None: auth is off); 401/403 otherwise.
agent = Depends(_require(Kind.AGENT))
gateway = Depends(_require(Kind.GATEWAY))
operator = Depends(_require(Kind.CONTROL_PLANE))
# The caller of a read: any fleet member (the replica list and the decisions name engines); 401 without one.
reader = Depends(_require(Kind.AGENT, Kind.GATEWAY, Kind.CONTROL_PLANE))
control_plane = Depends(plane)


def unknown_pool(cp: ControlPlane, name: str) -> JSONResponse:
    """404 for a pool the stack does not have, listing those it has."""
    return error_response(404, f"no pool {name!r}; pools: {', '.join(cp.pools)}", "pool")
