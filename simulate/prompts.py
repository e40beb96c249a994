"""Prompts: a trace request's prompt as the engines see it (token ids) and as the prefix scorer reads it (text).

A request's 512-token prefix blocks (Mooncake ``hash_ids``) become the same ids wherever they recur, so the
engines' prefix caches and the prefix-affinity scorer see exactly the trace's reuse; a request without prefix
blocks shares nothing. A request goes to the router with its tenant and ``cache_salt`` (`simulate.tenants`), and
to the engine with the salt, as the gateway sends them: the engine and every prefix scorer key its blocks by it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.base import RequestInfo
from simulate.trace import PREFIX_BLOCK_TOKENS, TraceRequest

__all__ = ["prompt_text", "prompt_tokens", "request_info"]

UNIQUE_BASE = 1 << 40  # token ids of prompts that share nothing: one id per request, far from block ids
TEXT_BLOCKS = 16  # prefix blocks rendered as text for the prefix-affinity scorer (~4 characters per token)


def prompt_tokens(request: TraceRequest, index: int) -> list[int]:
    """Token ids of ``request``'s prompt: block i of its prefix blocks is ``[id] * 512``; no blocks: unique."""
    if not request.prefix_blocks:
        return [UNIQUE_BASE + index] * request.prompt_tokens
    out: list[int] = []
    for block in request.prefix_blocks:
        out.extend([block] * PREFIX_BLOCK_TOKENS)
        if len(out) >= request.prompt_tokens:
            break
    if len(out) < request.prompt_tokens:  # more tokens than blocks: the tail is the request's own
        out.extend([UNIQUE_BASE + index] * (request.prompt_tokens - len(out)))
    return out[: request.prompt_tokens]


def prompt_text(request: TraceRequest) -> str:
    """The prompt as the gateway's prefix scorer reads it: 2,048 characters per 512-token block (the first
    ``TEXT_BLOCKS``), or a text of the request's own."""
    if not request.prefix_blocks:
        return f"<{request.rid}>" * 64
    return "".join(f"[block {b:>12}]".ljust(2048, ".") for b in request.prefix_blocks[:TEXT_BLOCKS])


def request_info(request: TraceRequest, tokens: Sequence[int], model: str, now: float) -> RequestInfo:
    """What the router reads about ``request`` (prompt ``tokens``), sent by its tenant (``acme`` for a trace
    without tenants) with its salt, at priority 8."""
    tenant = request.tenant or "acme"
    text = prompt_text(request)
    return RequestInfo(
        request.rid, model, tenant, 8, text, None, now, token_ids=tuple(tokens), cache_salt=request.cache_salt
    )
