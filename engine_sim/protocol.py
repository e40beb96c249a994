"""Protocol: OpenAI request parsing and vLLM 0.33's response framing (JSON bodies and SSE chunks).

Framing contracts (``vllm/entrypoints/openai/{chat_completion,completion}/serving.py``):

* SSE events are ``data: <json>\\n\\n`` and a stream always ends with ``data: [DONE]\\n\\n``.
* Chat: the first chunk (``delta: {"role": "assistant", "content": ""}``) is sent only with the first token,
  i.e. after prefill; then one chunk per engine step; the last one carries ``finish_reason``.
* Unset fields are omitted on stream chunks (``exclude_unset``); ``usage`` appears only in the final
  ``"choices": []`` chunk when ``stream_options.include_usage`` is true.
* Non-streaming bodies are full model dumps, nulls included.
* ``max_tokens`` larger than the room left in ``max_model_len`` is clamped (0.33), not rejected.

Chat templating (``ChatCompletionRequest.check_generation_prompt`` and the HF template's own checks):
``add_generation_prompt`` (default true) appends the assistant header; ``continue_final_message`` leaves the
final message open for the model to continue it, so it needs ``add_generation_prompt: false`` and an
assistant message last (400 otherwise). The continued text is part of the prompt (``usage.prompt_tokens``).

Prompt ids come from the server's tokenizer (`engine_sim.tokenizer.SimTokenizer`: the approximate default, or
a folder's with ``--tokenizer``), with vLLM's ``add_special_tokens`` defaults: false for chat (the template adds
them), true for completions; a request's own ``add_special_tokens`` is honoured. The request carries the
tokenizer on, so the text generated for it is made of that tokenizer's filler words.
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine_sim.answers import whole_answer
from engine_sim.errors import RequestError
from engine_sim.request import SimRequest
from engine_sim.tokenizer import APPROX, SimTokenizer
from engine_sim.validation import check_sampling, missing_field, schema_error, validation_error
from fleet.tokenizer import ChatRenderError

__all__ = ["GenerationRequest", "ResponseFramer", "cache_salt_of", "dumps", "parse_generation_request", "served_model"]

_DONE = b"data: [DONE]\n\n"


def dumps(value: Any) -> str:
    """Compact JSON, as vLLM's responses are serialised."""
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request: what the engine runs plus how the answer is framed."""

    kind: str  # "chat" | "completion"
    model: str
    prompt_token_ids: list[int]
    max_tokens: int
    natural_length: int | None  # output length at which the simulated model emits EOS; None: never
    stream: bool
    include_usage: bool
    continuous_usage: bool
    seed: int
    tokenizer: SimTokenizer = APPROX
    cache_salt: str | None = None  # vLLM's prefix-cache partition: block 0's hash takes it
    return_token_ids: bool = False  # vLLM's ``return_token_ids``: the prompt's and each token's ids in the answer
    logprobs: int | None = None  # alternatives per token when log-probabilities are asked for (0: the token's only)

    def to_sim_request(self, request_id: str) -> SimRequest:
        return SimRequest(
            request_id,
            self.prompt_token_ids,
            self.max_tokens,
            stop_after=self.natural_length,
            output_seed=self.seed,
            tokenizer=self.tokenizer,
            cache_salt=self.cache_salt,
        )


def _bad(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, "BadRequestError", param)


_CACHE_SALT_FORBIDDEN_CHARS = frozenset("@/\\\x00")  # vLLM 0.30+: entrypoints/generate/base/protocol.py
_MAX_CACHE_SALT_LENGTH = 128


def cache_salt_of(body: Mapping[str, Any]) -> str | None:
    """The body's ``cache_salt``, checked as vLLM's ``validate_cache_salt`` does (400 naming it)."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise _bad("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if len(salt) > _MAX_CACHE_SALT_LENGTH or any(char in _CACHE_SALT_FORBIDDEN_CHARS for char in salt):
        raise _bad(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.",
            "cache_salt",
        )
    return salt


def _bool_field(body: Mapping[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _bad(f"{name} must be a boolean", name)
    return value


def _chat_prompt(body: Mapping[str, Any], tokenizer: SimTokenizer) -> list[int]:
    if "messages" not in body:
        raise missing_field(body, "messages")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise schema_error("list_type", "body.messages", "Input should be a valid list", messages)
    if not messages or not all(isinstance(m, dict) for m in messages):
        raise _bad("messages must be a non-empty list of message objects", "messages")
    generation_prompt = _bool_field(body, "add_generation_prompt")
    continue_final = _bool_field(body, "continue_final_message") or False
    if continue_final and generation_prompt:
        raise _bad("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    if continue_final and generation_prompt is None:  # the template's default is true: the same conflict
        raise _bad(
            "continue_final_message and add_generation_prompt are not compatible: set add_generation_prompt to "
            "false to continue the final message.",
            "add_generation_prompt",
        )
    if continue_final and messages[-1].get("role") != "assistant":
        raise _bad("continue_final_message requires the final message to be an assistant message", "messages")
    try:
        return tokenizer.chat_prompt_ids(
            messages,
            add_generation_prompt=generation_prompt is not False,
            continue_final=continue_final,
            add_special_tokens=_bool_field(body, "add_special_tokens") or False,  # on top of the template's
        )
    except ChatRenderError as exc:
        raise _bad(str(exc), "messages") from None


def _natural_length(prompt_ids: list[int], prompt_len: int, tokenizer: SimTokenizer) -> int:
    """Output length at which the simulated model emits EOS: 16-512 tokens after the prompt less any generated
    text at its end, so a continuation stops where the uninterrupted answer would have (at least one token)."""
    base = tokenizer.strip_generated(prompt_ids)
    stop_at = len(base) + 16 + zlib.crc32(repr(base[-64:]).encode()) % 497
    return max(1, stop_at - prompt_len)


def _int_field(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name} must be an integer", name)
    return value


def served_model(body: Any, served_names: Sequence[str]) -> str:
    """The model a request body names (a served name, or the first when it names none), as vLLM checks it:
    400 for a body that is no JSON object, 404 for a model the server does not serve (naming the served ones)."""
    if not isinstance(body, dict):
        raise _bad("Request body must be a JSON object")
    model = body.get("model") or served_names[0]
    if model not in served_names:
        message = f"The model `{model}` does not exist. Valid aliases: {', '.join(served_names)}."
        raise RequestError(404, message, "NotFoundError", "model")
    return str(model)


def parse_generation_request(
    body: Any, kind: str, served_names: Sequence[str], max_model_len: int, tokenizer: SimTokenizer = APPROX
) -> GenerationRequest:
    """Validate an OpenAI body like vLLM does; RequestError (400/404) otherwise."""
    model = served_model(body, served_names)
    cache_salt = cache_salt_of(body)
    try:
        if kind == "chat":
            prompt_ids = _chat_prompt(body, tokenizer)
        else:
            special = _bool_field(body, "add_special_tokens") is not False  # vLLM's default for completions: true
            prompt_ids = _completion_prompt(body.get("prompt"), tokenizer, special)
    except UnicodeEncodeError:  # JSON may escape half a surrogate pair ("\ud800"); a tokenizer cannot encode it
        param = "messages" if kind == "chat" else "prompt"
        raise _bad("the prompt holds a lone UTF-16 surrogate, which is not text", param) from None
    max_tokens = _int_field(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens")
    prompt_len = len(prompt_ids)
    _check_limits(body, kind, prompt_len, max_tokens, max_model_len)
    n = _int_field(body, "n")
    if n is not None and n != 1:
        raise _bad("the simulator supports n=1 only", "n")
    room = max_model_len - prompt_len
    natural: int | None = None
    if max_tokens is None and not body.get("ignore_eos"):
        # No limit given: the simulated model answers at a deterministic "natural" length (an EOS).
        natural = _natural_length(prompt_ids, prompt_len, tokenizer)
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise _bad("stream_options must be an object", "stream_options")
    seed = body.get("seed")
    return GenerationRequest(
        kind=kind,
        model=model,
        prompt_token_ids=prompt_ids,
        max_tokens=min(max_tokens if max_tokens is not None else room, room),
        natural_length=natural,
        stream=bool(body.get("stream", False)),
        include_usage=bool(stream_options.get("include_usage", False)),
        continuous_usage=bool(stream_options.get("continuous_usage_stats", False)),
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else 0,
        tokenizer=tokenizer,
        cache_salt=cache_salt,
        return_token_ids=body.get("return_token_ids") is True,
        logprobs=_logprobs(body, kind),
    )


def _check_limits(
    body: Mapping[str, Any], kind: str, prompt_len: int, max_tokens: int | None, max_model_len: int
) -> None:
    """vLLM's checks, in its order: the output limit (TokenizeParams), the prompt's length, then the sampling
    parameters (`engine_sim.validation.check_sampling`)."""
    if max_tokens is not None and max_tokens > max_model_len:
        raise validation_error(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            "max_tokens",
            max_tokens,
        )
    if prompt_len >= max_model_len:
        # A text prompt is tokenized with truncation at max_model_len + 1, so vLLM only knows "at least" that.
        text = kind == "chat" or isinstance(body.get("prompt"), str)
        count = min(prompt_len, max_model_len + 1) if text else prompt_len
        qualifier = "at least " if count == max_model_len + 1 else ""
        raise validation_error(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{qualifier}{count} input tokens, which exceeds this limit even without any output tokens. Please "
            "reduce the length of the input prompt.",
            "input_tokens",
            count,
        )
    check_sampling(body, max_tokens)


def _logprobs(body: Mapping[str, Any], kind: str) -> int | None:
    """Chat: ``logprobs: true`` with ``top_logprobs`` alternatives; completions: ``logprobs: N``."""
    if kind == "chat":
        return (_int_field(body, "top_logprobs") or 0) if body.get("logprobs") is True else None
    return _int_field(body, "logprobs")


def _completion_prompt(prompt: Any, tokenizer: SimTokenizer, add_special_tokens: bool) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        return _completion_prompt(prompt[0], tokenizer, add_special_tokens)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise _bad("the simulator supports one prompt per request", "prompt")
    raise _bad("prompt must be a string or a list of token ids", "prompt")


def _usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


class ResponseFramer:
    """Builds one request's response: SSE chunks as bytes (templated for speed) or the final JSON body."""

    def __init__(
        self, request: GenerationRequest, prompt_details: bool = False, fingerprint: str | None = None
    ) -> None:
        self.request = request
        self.fingerprint = fingerprint  # vLLM's system_fingerprint: on whole answers and a stream's last chunk
        self.chat = request.kind == "chat"
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        self.id = prefix + uuid.uuid4().hex
        self.created = int(time.time())
        self.prompt_details = prompt_details
        self._started = False
        self.completion_tokens = 0
        self.kv_transfer_params: dict[str, Any] | None = None  # a prefill leg's, on its whole answer (P/D)
        head = dumps({"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion"})[:-1]
        self._head = f'data: {head},"created":{self.created},"model":{dumps(request.model)},"choices":['

    # -- streaming -----------------------------------------------------------------------------------------
    def _choice(self, text: str, finish: str | None, ids: str = "") -> str:
        """One streamed choice; ``ids``: its ``return_token_ids`` fields (``,"token_ids":[...]``), if asked."""
        fin = "null" if finish is None else f'"{finish}"'
        if self.chat:
            tail = "" if finish is None else ',"stop_reason":null'
            return f'{{"index":0,"delta":{{"content":{dumps(text)}}},"logprobs":null,"finish_reason":{fin}{tail}{ids}}}'
        return f'{{"index":0,"text":{dumps(text)},"logprobs":null,"finish_reason":{fin},"stop_reason":null{ids}}}'

    def _token_ids(self, token: int | None) -> str:
        """A streamed choice's id fields, null unless ``return_token_ids``: the token's id, and for completions
        the prompt's ids in the first chunk (a chat stream has them in its role chunk)."""
        own = "null" if token is None or not self.request.return_token_ids else f"[{token}]"
        if self.chat:
            return f',"token_ids":{own}'
        first = self.completion_tokens == 1 and self.request.return_token_ids
        return f',"prompt_token_ids":{dumps(self.request.prompt_token_ids) if first else "null"},"token_ids":{own}'

    def chunks(self, tokens: Sequence[int], finish: str | None, prompt_tokens: int) -> bytes:
        """SSE events for ``tokens`` (one per engine step), the last carrying ``finish`` when set."""
        parts: list[str] = []
        if self.chat and not self._started:
            ids = dumps(self.request.prompt_token_ids) if self.request.return_token_ids else "null"
            prompt_ids = f',"prompt_token_ids":{ids},"prompt_text":null'
            parts.append(
                f'{self._head}{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,'
                f'"finish_reason":null}}]{prompt_ids}}}\n\n'
            )
        self._started = True
        usage = ""
        last = len(tokens) - 1
        # The fingerprint rides on the stream's last chunk: the usage chunk when there is one, else the finish.
        tail = self._fingerprint() if finish is not None and not self.request.include_usage else ""
        for i, token in enumerate(tokens):
            self.completion_tokens += 1
            if self.request.continuous_usage:
                usage = ',"usage":' + dumps(_usage(prompt_tokens, self.completion_tokens, None))
            text = self.request.tokenizer.token_text(token)
            end = i == last
            choice = self._choice(text, finish if end else None, self._token_ids(token))
            parts.append(f"{self._head}{choice}]{usage}{tail if end else ''}}}\n\n")
        if not tokens and finish is not None:
            parts.append(f"{self._head}{self._choice('', finish, self._token_ids(None))}]{tail}}}\n\n")
        return "".join(parts).encode()

    def _fingerprint(self) -> str:
        return "" if self.fingerprint is None else f',"system_fingerprint":{dumps(self.fingerprint)}'

    def closing(self, prompt_tokens: int, cached_tokens: int) -> bytes:
        """The optional usage chunk and ``[DONE]``."""
        if not self.request.include_usage:
            return _DONE
        usage = _usage(prompt_tokens, self.completion_tokens, cached_tokens if self.prompt_details else None)
        return f'{self._head}],"usage":{dumps(usage)}{self._fingerprint()}}}\n\n'.encode() + _DONE

    def error_event(self, error: RequestError) -> bytes:
        return f"data: {dumps(error.to_json())}\n\n".encode() + _DONE

    # -- full responses ------------------------------------------------------------------------------------
    def body(self, tokens: Sequence[int], finish: str, prompt_tokens: int, cached_tokens: int) -> dict[str, Any]:
        """The whole answer (`engine_sim.answers`): vLLM's full model dump, nulls included."""
        usage = _usage(prompt_tokens, len(tokens), cached_tokens if self.prompt_details else None)
        usage.setdefault("prompt_tokens_details", None)
        usage["completion_tokens_details"] = None
        head = {"id": self.id, "created": self.created, "fingerprint": self.fingerprint, "usage": usage,
                "kv_transfer_params": self.kv_transfer_params}  # fmt: skip
        return whole_answer(self.request, tokens, finish, head)
