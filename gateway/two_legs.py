"""Two legs: a disaggregated pool's request, prefilled on a prefill replica and decoded on the replica routed to.

vLLM's NixlConnector in pull mode (../shared/research/pd_disaggregation.md, section 1.4) is two serial HTTP
requests with the same ``X-Request-Id``: the **prefill leg** is the client's body with ``stream: false``,
``max_tokens: 1`` (and ``max_completion_tokens: 1`` when sent), no ``stream_options``, no ``min_tokens``, and
``kv_transfer_params: {"do_remote_decode": true, ...}``; its answer's ``kv_transfer_params`` (engine id, block
ids, side-channel host and port, ...) go unchanged into the **decode leg**, the client's own body, which the decode
engine answers after pulling the prompt's KV cache from the prefill engine.

`PrefillLeg.run` is called once the decode replica is chosen (the pool's router picked it, as for any request):

* it decides with `fleet.capacity.disagg.should_disaggregate`, the simulator's function: only chat and
  completions requests (vLLM's ``kv_transfer_params`` lives on those two protocols) whose prompt tokens the decode
  replica is not expected to hold (the router's ``spared`` share) exceed the pool's ``thresholdTokens``;
* it picks a prefill replica with the same router plugins (the ``<pool>-prefill`` role pool's router) and sends
  the leg; a leg that fails (refused, broken, timed out, a 5xx, an answer without ``kv_transfer_params``) is
  tried once more on another prefill replica while the retry budget allows, and otherwise the request is done
  aggregated on the decode replica: the client never sees a prefill failure;
* it returns the parameters for the decode leg (`with_kv_transfer` puts them in a body), or None: aggregated.

The decode leg's own failure before anything reached the client (a streamed leg whose first event is an error:
vLLM's answer when it cannot load the KV cache under ``kvLoadFailurePolicy: fail``; a whole answer's 5xx) is
retried by `gateway.service` on the same decode replica, aggregated. After the first event reaches the client,
resumption applies as to any stream. Tenants never send ``kv_transfer_params``: `gateway.body` refuses the field.

Series: ``llmfleet_gateway_pd_requests_total{model,path}``, path ``disaggregated`` (two legs), ``aggregated`` (the
decision kept it on the decode replica), ``no_prefill_replica``, ``prefill_failed`` and ``decode_failed`` (done
aggregated after a leg failed).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fleet.capacity.disagg import should_disaggregate
from fleet.spec.disagg import PREFILL_SUFFIX
from gateway.call import Call
from gateway.errors import UpstreamError, UpstreamStatus
from gateway.proxy import SseRelay
from gateway.upstream import Upstream

__all__ = ["PD_KINDS", "PrefillLeg", "decode_opened", "prefill_body", "with_kv_transfer"]

log = logging.getLogger("llmfleet.gateway")

PD_KINDS = frozenset({"chat", "completion"})  # vLLM's protocols that carry kv_transfer_params
_PREFILL_TRIES = 2  # prefill replicas tried before a request is done aggregated
# The prefill leg asks for one token; these would make it decode more (vLLM's reference proxy pops them too).
_DROPPED = ("stream_options", "min_tokens", "min_completion_tokens")
_SKELETON = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_body(body: bytes) -> bytes:
    """The prefill leg's body for a client body (already as the engine receives it)."""
    payload = json.loads(body)
    for key in _DROPPED:
        payload.pop(key, None)
    payload["stream"] = False
    payload["max_tokens"] = 1
    if "max_completion_tokens" in payload:
        payload["max_completion_tokens"] = 1
    payload["kv_transfer_params"] = dict(_SKELETON)
    return json.dumps(payload, separators=(",", ":")).encode()


def with_kv_transfer(body: bytes, params: dict[str, Any] | None) -> bytes:
    """``body`` with the prefill engine's ``kv_transfer_params`` (the decode leg); ``body`` itself for None."""
    if params is None:
        return body
    payload = json.loads(body)
    payload["kv_transfer_params"] = params
    return json.dumps(payload, separators=(",", ":")).encode()


async def decode_opened(relay: SseRelay, first: bytes, kind: str, timeout_s: float) -> bytes | None:
    """A streamed decode leg's events up to its first token, or None when the decode engine failed before it: an
    error event of its own (a 5xx: it could not load the KV cache), no token within ``timeout_s``, or the stream's
    end. A chat stream's first event is the assistant's role alone, sent before the engine has loaded anything,
    so one more event is read for chat."""
    try:
        async with asyncio.timeout(timeout_s):
            while kind == "chat" and relay.events < 2 and relay.error_code is None and not relay.done:
                first += await relay.first()
    except (TimeoutError, UpstreamError):
        return None
    return None if relay.error_code is not None and relay.error_code >= 500 else first


def _transfer_params(answer: bytes) -> dict[str, Any] | None:
    """The prefill answer's ``kv_transfer_params`` when it is the pull contract's (it names the blocks to read)."""
    try:
        payload = json.loads(answer)
    except ValueError:
        return None
    params = payload.get("kv_transfer_params") if isinstance(payload, dict) else None
    if not isinstance(params, dict) or params.get("do_remote_prefill") is not True:
        return None
    return params


class PrefillLeg:
    """Runs the prefill leg of one request when its pool is disaggregated and the decision says so."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        metrics = upstream.metrics
        self._count = metrics.pd_requests

    def counted(self, call: Call, path: str) -> None:
        self.upstream.metrics.child(self._count, call.pool.served_name, path).inc()

    def applies(self, call: Call) -> bool:
        """Whether the request's pool prefills apart and the request's protocol can."""
        return call.pool.disaggregation is not None and call.parsed.kind in PD_KINDS

    async def run(self, call: Call, uncached: int) -> dict[str, Any] | None:
        """The decode leg's ``kv_transfer_params``, or None when the request is done aggregated (the decision, no
        prefill replica, or a failed prefill leg). ``uncached``: the prompt tokens the decode replica is expected
        to prefill itself."""
        pd = call.pool.disaggregation
        if pd is None or call.parsed.kind not in PD_KINDS:
            return None
        if not should_disaggregate(uncached, pd.threshold_tokens):
            self.counted(call, "aggregated")
            return None
        up, role = self.upstream, call.pool.name + PREFILL_SUFFIX
        body, tried = prefill_body(call.body), set[str]()
        with call.spans.phase("prefill", {"llmfleet.pd.uncached_tokens": uncached}) as span:
            while len(tried) < _PREFILL_TRIES:
                decision = up.route(role, call.info, exclude=tried, ready_only=True)
                if decision is None:
                    break
                if tried and not up.budget.try_spend():
                    break
                tried.add(decision.endpoint.id)
                span.set_attribute("llmfleet.pd.prefill_replica", decision.endpoint.id)
                with up.endpoints.lease(decision.endpoint) as ep:
                    try:
                        answer = await up.send(ep, call.path, body, call.headers)
                    except UpstreamStatus as exc:
                        # The engine refused the leg (a 4xx is the request's fault: the decode replica will answer
                        # it in its own words; a 5xx is the replica's): aggregated, without another prefill try.
                        log.info("prefill leg of %s refused by %s: %s", call.out.request_id, ep.id, exc)
                        if exc.status >= 500:
                            up.endpoints.failed(ep)
                        self.counted(call, "prefill_failed")
                        return None
                    except UpstreamError as exc:
                        up.account(ep, exc)
                        log.info("prefill leg of %s failed on %s: %s", call.out.request_id, ep.id, exc)
                        continue
                    params = _transfer_params(answer.body)
                    if params is None:
                        log.warning("prefill replica %s answered %s without kv_transfer_params", ep.id, call.path)
                        continue
                    up.succeeded(ep)
                    self.counted(call, "disaggregated")
                    return params
        self.counted(call, "prefill_failed" if tried else "no_prefill_replica")
        return None
