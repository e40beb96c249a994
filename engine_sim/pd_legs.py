"""P/D legs: what a generation request's ``kv_transfer_params`` make of its run, on an engine with NIXL configured.

`prepare_leg` reads the body's ``kv_transfer_params`` (an engine without a connector ignores them, as vLLM does):

* ``do_remote_decode`` true: a **prefill leg**. It runs as usual with ``kv_hold``; once it finishes length-capped,
  `engine_sim.nixl.NixlConnector.offer` leases its blocks and a whole answer carries the lease as top-level
  ``kv_transfer_params``. A streamed prefill leg leases them too, but its chunks do not carry the parameters (the
  0.32 streams captured carry none), so its blocks wait for the lease to end.
* ``do_remote_prefill`` true with the remote fields: a **decode leg**. The pull runs before the request enters the
  scheduler (vLLM parks it in ``WAITING_FOR_REMOTE_KVS``), and its time counts in the request's TTFT (``arrived``).
  The request then enters with ``remote_tokens``: no prefill work but its last prompt token. ``usage``'s
  ``prompt_tokens_details.cached_tokens`` (with ``--enable-prompt-tokens-details``) is the parameters' integer
  ``remote_prefill_cached_tokens`` when there is one (vLLM 0.31+ reports the prefill engine's prefix hits, unchecked,
  vllm#58728), else the decode engine's own count.
* A failed pull: with ``kv_load_failure_policy`` ``"recompute"`` the leg prefills locally (still from ``arrived``);
  with ``"fail"`` it fails with vLLM's ``GenerationError``: 500 "Internal server error", which a whole answer
  gets as its status and a stream as HTTP 200, one ``data:`` error event (``json.dumps``' spacing, as captured in
  research/pd_probe/result_nixl_killp_fail.json) and ``data: [DONE]`` (`failed_leg_events`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engine_sim.errors import RequestError
from engine_sim.nixl import KvLoadError, NixlConnector
from engine_sim.protocol import GenerationRequest, dumps
from engine_sim.request import SimRequest

__all__ = ["PLAIN", "Leg", "base_id_of", "failed_leg_events", "failed_leg_response", "generation_error", "prepare_leg"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}

log = logging.getLogger("engine_sim")


@dataclass(frozen=True)
class Leg:
    """How a request runs: a prefill leg (``hold``), a decode leg (``remote_tokens``), or neither; ``error`` when
    its pull failed under policy ``fail``."""

    hold: bool = False
    nixl: NixlConnector | None = None  # a prefill leg's connector, which leases its blocks (`offer`)
    kind: str = "completion"
    base_id: str = ""  # vLLM's id of the request before its suffix: ``cmpl-<X-Request-Id>`` or a random one
    remote_tokens: int = 0
    reported_cached: int | None = None  # usage's cached_tokens in place of the engine's own count
    arrived: float | None = None  # model time it arrived, when a pull came before its submission
    error: RequestError | None = None

    def apply(self, request: SimRequest) -> SimRequest:
        request.kv_hold = self.hold
        request.remote_tokens = self.remote_tokens
        return request

    def offer(self, request: SimRequest) -> dict[str, Any] | None:
        """A finished prefill leg's lease (its ``kv_transfer_params``); None for any other request."""
        if not self.hold or self.nixl is None:
            return None
        return self.nixl.offer(request, self.kind, self.base_id)

    def cached_tokens(self, engine_count: int) -> int:
        return self.reported_cached if self.reported_cached is not None else max(0, engine_count)


PLAIN = Leg()


def generation_error() -> RequestError:
    """vLLM's ``GenerationError``: what a request that finished with ``finish_reason`` error answers."""
    return RequestError(500, "Internal server error", "InternalServerError")


def failed_leg_events(error: RequestError) -> bytes:
    """A failed decode leg's whole SSE body after its 200 headers."""
    return f"data: {json.dumps(error.to_json())}\n\n".encode() + b"data: [DONE]\n\n"


async def failed_leg_response(request: web.Request, stream: bool, error: RequestError) -> web.StreamResponse:
    """A decode leg whose pull failed under policy ``fail``: 500, or a stream's 200 and one error event."""
    if not stream:
        return web.json_response(error.to_json(), status=error.status, dumps=dumps)
    response = web.StreamResponse(headers=_SSE_HEADERS)
    await response.prepare(request)
    await response.write(failed_leg_events(error))
    await response.write_eof()
    return response


def base_id_of(kind: str, client_id: str | None, default: str) -> str:
    """vLLM's id of a request before its suffix: the client's ``X-Request-Id`` when it sends one (a P/D proxy sends
    the same on both legs) after ``cmpl-`` or ``chatcmpl-``, else ``default`` (a random one)."""
    return default if not client_id else ("chatcmpl-" if kind == "chat" else "cmpl-") + client_id


async def prepare_leg(nixl: NixlConnector | None, body: Mapping[str, Any], gen: GenerationRequest, base_id: str) -> Leg:
    """The leg ``body`` asks for; for a decode leg, after its pull (or its failure, under the policy)."""
    params = body.get("kv_transfer_params")
    if nixl is None or not isinstance(params, dict):
        return PLAIN
    if params.get("do_remote_decode"):
        return Leg(hold=True, nixl=nixl, kind=gen.kind, base_id=base_id)
    if not nixl.wants_pull(params):
        return PLAIN
    cached = params.get("remote_prefill_cached_tokens")
    reported = cached if isinstance(cached, int) and not isinstance(cached, bool) else None
    arrived = nixl.engine.now()
    try:
        tokens = await nixl.pull(params, gen.prompt_token_ids, gen.cache_salt)
    except KvLoadError as exc:
        recompute = nixl.settings.recompute
        log.error("%s (kv_load_failure_policy %s)", exc, nixl.settings.failure_policy)
        error = None if recompute else generation_error()
        return Leg(reported_cached=reported, arrived=arrived, error=error)
    return Leg(remote_tokens=tokens, reported_cached=reported, arrived=arrived)
