"""Embeddings: ``POST /v1/embeddings`` as vLLM 0.33 serves it on a pooling server (``--runner pooling``).

vLLM registers the route only for a pooling model and the generation routes only for a generative one: a server
does one or the other (`vllm/entrypoints/pooling/embed/api_router.py`, `vllm/entrypoints/pooling/factories.py`).
The request is its completion form (`vllm/entrypoints/pooling/base/protocol.py`, ``CompletionRequestMixin`` and
``EmbedRequestMixin``): ``input`` a string, a list of strings, a list of token ids or a list of those;
``encoding_format`` ``float`` (default) or ``base64`` (float32 bytes, native order, what the ``openai`` client asks
for and decodes); ``dimensions`` only where the model has matryoshka dimensions, which none simulated here has; a
prompt over ``max_model_len`` is refused. The answer (`vllm/entrypoints/pooling/embed/protocol.py`):
``{"id": "embd-...", "object": "list", "created", "model", "data": [{"index", "object": "embedding",
"embedding"}], "usage"}`` with prompt tokens only.

Each input is one request through the simulated engine with one output step, so it pays its prefill in the same
batches as everything else; its vector is unit-length, of the model's hidden size, and depends only on its token
ids (the same input always embeds the same). The chat form (``messages``) is not simulated: 400.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine_sim.errors import RequestError
from engine_sim.protocol import served_model
from engine_sim.tokenizer import SimTokenizer

__all__ = ["EmbeddingRequest", "embedding_body", "parse_embedding_request", "vector"]


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: list[list[int]]  # each input's prompt token ids
    encoding_format: str


def _bad(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, "BadRequestError", param)


def _ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def _inputs(value: Any, tokenizer: SimTokenizer, special: bool) -> list[list[int]]:
    if isinstance(value, str):
        return [tokenizer.encode(value, add_special_tokens=special)]
    if _ids(value):
        return [list(value)]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return [tokenizer.encode(v, add_special_tokens=special) for v in value]
    if isinstance(value, list) and value and all(_ids(v) for v in value):
        return [list(v) for v in value]
    raise _bad("input must be a string, a list of strings, a list of token ids or a list of those", "input")


def parse_embedding_request(
    body: Any, served_names: Sequence[str], max_model_len: int, tokenizer: SimTokenizer, dimensions: int
) -> EmbeddingRequest:
    """Validate an embeddings body as vLLM does; RequestError (400/404) otherwise."""
    model = served_model(body, served_names)
    if "input" not in body:
        raise _bad("input is required (the chat form, messages, is not simulated)", "input")
    special = body.get("add_special_tokens", True)
    if not isinstance(special, bool):
        raise _bad("add_special_tokens must be a boolean", "add_special_tokens")
    try:
        inputs = _inputs(body["input"], tokenizer, special)
    except UnicodeEncodeError:  # JSON may escape half a surrogate pair ("\ud800"); a tokenizer cannot encode it
        raise _bad("the input holds a lone UTF-16 surrogate, which is not text", "input") from None
    for ids in inputs:
        if len(ids) > max_model_len:
            raise _bad(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{len(ids)} tokens in the input for embedding generation. Please reduce the length of the input.",
                "input",
            )
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise _bad(f"encoding_format must be 'float' or 'base64', not {encoding!r}", "encoding_format")
    wanted = body.get("dimensions")
    if wanted is not None and wanted != dimensions:
        raise _bad("Model does not support matryoshka representation, changing output dimensions will lead to "
                   "poor results.", "dimensions")  # fmt: skip
    return EmbeddingRequest(model, inputs, encoding)


def vector(token_ids: Sequence[int], dimensions: int) -> list[float]:
    """A unit vector of ``dimensions`` that depends only on ``token_ids``."""
    digest = hashlib.sha256(struct.pack(f"<{len(token_ids)}q", *token_ids)).digest()
    rng = random.Random(digest)
    values = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _encoded(values: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return values
    return base64.b64encode(struct.pack(f"={len(values)}f", *values)).decode()


def embedding_body(request: EmbeddingRequest, dimensions: int) -> dict[str, Any]:
    """The answer to ``request``: one vector per input, usage in prompt tokens."""
    prompt = sum(len(ids) for ids in request.inputs)
    data = [
        {"index": i, "object": "embedding", "embedding": _encoded(vector(ids, dimensions), request.encoding_format)}
        for i, ids in enumerate(request.inputs)
    ]
    return {
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": request.model,
        "data": data,
        "usage": {
            "prompt_tokens": prompt,
            "total_tokens": prompt,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },  # fmt: skip
    }
