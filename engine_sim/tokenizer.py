"""Tokenizer: a deterministic approximation of a BPE tokenizer with consistent counts.

Contract: ``encode(text)`` splits text into pieces (an optional leading space plus up to six letters, up to
three digits, one other character, or a run of whitespace) and maps each piece to a stable id in
``[0, VOCAB_SIZE)``. Chat messages are rendered with a ChatML template whose markers count as one token each.
Generated text is filler made of one-token words, so ``len(encode(filler_text(ids)))`` equals ``len(ids)``
and ``usage`` always matches what a client would count. Roughly 1.3 tokens per English word, like real BPE.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence

__all__ = [
    "VOCAB_SIZE",
    "chat_prompt_ids",
    "encode",
    "filler_ids",
    "filler_text",
    "token_text",
]

VOCAB_SIZE = 151_000
_SPECIAL = ("<|im_start|>", "<|im_end|>")
_PIECE = re.compile(r"<\|im_start\|>|<\|im_end\|>| ?[A-Za-z]{1,6}| ?\d{1,3}|\s+|.", re.DOTALL)

# One-token filler words (each matches `` ?[A-Za-z]{1,6}`` exactly once).
_WORDS = (
    " the",
    " of",
    " and",
    " a",
    " to",
    " in",
    " is",
    " it",
    " that",
    " for",
    " on",
    " with",
    " as",
    " was",
    " model",
    " token",
    " engine",
    " batch",
    " cache",
    " block",
    " step",
    " queue",
    " fleet",
    " serve",
    " fast",
    " large",
    " small",
    " data",
    " time",
    " value",
    " each",
    " when",
    " then",
    " more",
    " less",
)
_WORD_ID_BASE = VOCAB_SIZE - len(_WORDS)


def _piece_id(piece: str) -> int:
    return zlib.crc32(piece.encode()) % _WORD_ID_BASE


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (deterministic across processes and runs)."""
    return [_piece_id(p) for p in _PIECE.findall(text)]


def chat_prompt_ids(messages: Sequence[Mapping[str, object]]) -> list[int]:
    """Token ids of a ChatML rendering of ``messages`` plus the assistant generation prompt."""
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{_SPECIAL[0]}{message.get('role', 'user')}\n{content or ''}{_SPECIAL[1]}\n")
    parts.append(f"{_SPECIAL[0]}assistant\n")
    return encode("".join(parts))


def filler_ids(seed: int, start: int, count: int) -> list[int]:
    """``count`` generated token ids, positions ``start..start+count-1`` of the stream seeded by ``seed``."""
    n = len(_WORDS)
    return [_WORD_ID_BASE + (seed * 7 + (start + i) * 13 + (start + i) // n) % n for i in range(count)]


def token_text(token_id: int) -> str:
    """Text of a generated token id (from `filler_ids`)."""
    return _WORDS[(token_id - _WORD_ID_BASE) % len(_WORDS)]


def filler_text(ids: Sequence[int]) -> str:
    return "".join(token_text(i) for i in ids)
