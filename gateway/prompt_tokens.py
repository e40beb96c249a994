"""Prompt tokens: a request's prompt as its pool's engine tokenizes it, for the ``kv-cache`` scorer.

Each pool with ``engine.tokenizer`` (a folder with ``tokenizer.json`` and the chat template, the engine's own
``--tokenizer``) gets its tokenizer loaded once, at start (`fleet.tokenizer.load_tokenizer`); a folder that
cannot be read fails the gateway's start with the reason. A pool without one takes the tokenizer fetched from the
stack's model store, if any (`gateway.tokenizer_store`: on a cluster, the files the engine loads with the model).
Only pools whose router scores with ``kv-cache`` are loaded: tokenizing costs CPU per request
(bench/gateway_overhead.py measures it).

What is tokenized is what the engine tokenizes:

* chat completions: ``messages`` rendered with the chat template, ``add_generation_prompt`` (default true) and
  ``continue_final_message`` (default false) as the request sets them, special tokens only when the request's
  ``add_special_tokens`` asks (vLLM's default for chat requests: none);
* completions: a string ``prompt`` encoded with special tokens (vLLM's default for completion requests), or a
  prompt given as token ids taken as it is; a list of prompts (a batch) is not scored.

A request the template cannot render (a role it refuses) or of any other shape gets no tokens: the engine answers
it as it would, and routing falls back to the other scorers. Never an error of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fleet.spec.stack import PoolSpec
from fleet.tokenizer import ModelTokenizer, load_tokenizer
from gateway.body import ParsedRequest

__all__ = ["PromptTokens"]

log = logging.getLogger("llmfleet.gateway.prompt_tokens")


class PromptTokens:
    """Tokenizers by pool name; ``ids(pool, parsed)`` the prompt's token ids, or None.

    A pool's ``engine.tokenizer`` folder comes first; without one, its tokenizer in ``fetched`` (by pool name,
    from the model store), else none."""

    def __init__(self, pools: Iterable[PoolSpec], fetched: Mapping[str, ModelTokenizer] | None = None) -> None:
        self._tokenizers: dict[str, ModelTokenizer] = {}
        for pool in pools:
            if pool.engine.tokenizer is not None:
                self._tokenizers[pool.name] = load_tokenizer(Path(pool.engine.tokenizer))
            elif fetched is not None and pool.name in fetched:
                self._tokenizers[pool.name] = fetched[pool.name]

    def __contains__(self, pool: str) -> bool:
        return pool in self._tokenizers

    def ids(self, pool: str, parsed: ParsedRequest) -> tuple[int, ...] | None:
        tokenizer = self._tokenizers.get(pool)
        if tokenizer is None:
            return None
        try:
            return _ids(tokenizer, parsed.kind, parsed.payload)
        except Exception as exc:  # noqa: BLE001 - a template's own error (raise_exception) has no fixed type
            log.debug("no prompt tokens for a %s request: %s", parsed.kind, exc)
            return None


def _ids(tokenizer: ModelTokenizer, kind: str, payload: dict[str, Any]) -> tuple[int, ...] | None:
    if kind == "embedding":  # no KV-cache routing: a pooling engine publishes no events to match against
        return None
    if kind == "chat":
        messages = payload.get("messages")
        if not isinstance(messages, list):
            return None
        ids = tokenizer.chat_ids(
            messages,
            add_generation_prompt=bool(payload.get("add_generation_prompt", True)),
            continue_final_message=bool(payload.get("continue_final_message", False)),
            add_special_tokens=bool(payload.get("add_special_tokens", False)),
        )
        return tuple(ids)
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return tuple(tokenizer.encode(prompt, add_special_tokens=bool(payload.get("add_special_tokens", True))))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return tuple(prompt)
    return None
