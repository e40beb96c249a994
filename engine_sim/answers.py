"""Answers: a whole (not streamed) chat or completion body, as vLLM 0.32 sends it and 0.33's protocol models it.

Every field vLLM's response models carry is present, null where the simulator has nothing to say
(``routed_experts``, ``ec_transfer_params``, ``metrics``, ...), measured against the real engine by the
differential suite (``tests/vllm/test_differential.py``). Log-probabilities, when asked for, are the simulated
model's: the generated token is always the likeliest, at a log-probability that falls slowly along the answer,
and the alternatives are the next filler words at lower ones. They have the real shapes (chat's ``content``
list of tokens with ``bytes`` and ``top_logprobs``; completions' parallel ``tokens``/``token_logprobs``/
``text_offset`` lists and one ``{token: logprob}`` map per token), not a model's numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from engine_sim.tokenizer import SimTokenizer

__all__ = ["AnsweredRequest", "whole_answer"]


class AnsweredRequest(Protocol):
    """What an answer reads of its request (`engine_sim.protocol.GenerationRequest` has it)."""

    @property
    def kind(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def tokenizer(self) -> SimTokenizer: ...
    @property
    def return_token_ids(self) -> bool: ...
    @property
    def logprobs(self) -> int | None: ...


def whole_answer(
    request: AnsweredRequest, tokens: Sequence[int], finish: str, head: Mapping[str, Any]
) -> dict[str, Any]:
    """``head``: the answer's ``id``, ``created``, ``fingerprint``, ``usage`` and (a P/D prefill leg's)
    ``kv_transfer_params``."""
    text = request.tokenizer.filler_text(tokens)
    ids = list(tokens) if request.return_token_ids else None
    prompt_ids = request.prompt_token_ids if request.return_token_ids else None
    common = {"id": head["id"], "created": head["created"], "model": request.model}
    kv = head.get("kv_transfer_params")
    if request.kind == "chat":
        message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                   "function_call": None, "reasoning": None}  # fmt: skip
        logprobs = None if request.logprobs is None else _chat_logprobs(request.tokenizer, tokens, request.logprobs)
        choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish,
                  "stop_reason": None, "token_ids": ids, "routed_experts": None}  # fmt: skip
        return {**common, "object": "chat.completion", "choices": [choice], "service_tier": None,
                "system_fingerprint": head["fingerprint"], "usage": head["usage"], "prompt_logprobs": None,
                "prompt_token_ids": prompt_ids, "prompt_text": None, "kv_transfer_params": kv,
                "ec_transfer_params": None, "metrics": None}  # fmt: skip
    logprobs = None if request.logprobs is None else _completion_logprobs(request.tokenizer, tokens, request.logprobs)
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": None,
              "token_ids": ids, "prompt_logprobs": None, "prompt_token_ids": prompt_ids,
              "routed_experts": None}  # fmt: skip
    return {**common, "object": "text_completion", "choices": [choice], "service_tier": None,
            "system_fingerprint": head["fingerprint"], "usage": head["usage"], "kv_transfer_params": kv,
            "ec_transfer_params": None, "metrics": None}  # fmt: skip


def _candidates(tokenizer: SimTokenizer, position: int, token: int, top: int) -> list[tuple[str, float]]:
    """The token and ``top - 1`` alternatives with their log-probabilities, likeliest first."""
    best = -0.5 - 0.01 * position
    vocab = tokenizer.filler_vocab  # generated ids are filler ids: the alternatives are the next filler words
    at = vocab.index(token) if token in vocab else 0
    others = [vocab[(at + k) % len(vocab)] for k in range(1, max(top, 1))]
    return [(tokenizer.token_text(token), best)] + [
        (tokenizer.token_text(other), best - 0.25 * k) for k, other in enumerate(others, start=1)
    ]


def _chat_logprobs(tokenizer: SimTokenizer, tokens: Sequence[int], top: int) -> dict[str, Any]:
    content = []
    for i, token in enumerate(tokens):
        ranked = _candidates(tokenizer, i, token, top)
        alternatives = [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in ranked[:top]]
        text, logprob = ranked[0]
        content.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": alternatives})
    return {"content": content}


def _completion_logprobs(tokenizer: SimTokenizer, tokens: Sequence[int], top: int) -> dict[str, Any]:
    offsets, texts, logprobs, tops, at = [], [], [], [], 0
    for i, token in enumerate(tokens):
        ranked = _candidates(tokenizer, i, token, top)
        text, logprob = ranked[0]
        offsets.append(at)
        texts.append(text)
        logprobs.append(logprob)
        tops.append(dict(ranked[:top]) if top else None)
        at += len(text)
    return {"text_offset": offsets, "token_logprobs": logprobs, "tokens": texts, "top_logprobs": tops}
