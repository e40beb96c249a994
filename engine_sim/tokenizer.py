"""Tokenizer: a deterministic approximation of a BPE tokenizer with consistent counts.

Contract: ``encode(text)`` splits text into pieces (an optional leading space plus up to six letters, up to
three digits, one other character, or a run of whitespace) and maps each piece to a stable id in
``[0, VOCAB_SIZE)``. Chat messages are rendered with a ChatML template whose markers count as one token each;
a message's content is tokenized on its own, as a BPE pre-tokenizer splits it from the template around it.
Roughly 1.3 tokens per English word, like real BPE.

Generated text is filler made of one-token words whose ids are their own (``encode(filler_text(ids)) == ids``),
so ``usage`` always matches what a client would count. The word at sequence position P (prompt tokens first)
depends only on the seed and P (`filler_ids`): text the model generated, sent back as the end of a prompt
(a chat's final assistant message with ``continue_final_message``, or a completion's prompt), is continued
exactly where it stopped, with no gap and no repeat.
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
    "strip_generated",
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
_WORD_IDS = {word: _WORD_ID_BASE + i for i, word in enumerate(_WORDS)}


def _piece_id(piece: str) -> int:
    found = _WORD_IDS.get(piece)
    return found if found is not None else zlib.crc32(piece.encode()) % _WORD_ID_BASE


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (deterministic across processes and runs)."""
    return [_piece_id(p) for p in _PIECE.findall(text)]


def chat_prompt_ids(
    messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = True, continue_final: bool = False
) -> list[int]:
    """Token ids of a ChatML rendering of ``messages``, then the assistant generation prompt when
    ``add_generation_prompt``. ``continue_final`` leaves the last message open (no end marker), for the model to
    continue it; the caller checks that it is an assistant message and that no generation prompt follows."""
    ids: list[int] = []
    last = len(messages) - 1
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        ids += encode(f"{_SPECIAL[0]}{message.get('role', 'user')}\n") + encode(str(content or ""))
        if not (continue_final and i == last):
            ids += encode(f"{_SPECIAL[1]}\n")
    if add_generation_prompt:
        ids += encode(f"{_SPECIAL[0]}assistant\n")
    return ids


def filler_ids(seed: int, start: int, count: int) -> list[int]:
    """``count`` generated token ids for sequence positions ``start..start+count-1`` (the prompt's tokens are
    positions ``0..len(prompt)-1``). A function of ``seed`` and the position only: period 35 x 35 tokens."""
    n = len(_WORDS)
    return [_WORD_ID_BASE + (seed * 7 + (start + i) * 13 + (start + i) // n) % n for i in range(count)]


def strip_generated(ids: Sequence[int]) -> list[int]:
    """``ids`` without their trailing run of filler words: the prompt as it was before any text the model may
    have generated (and was sent back to be continued) was appended to it."""
    end = len(ids)
    while end > 0 and ids[end - 1] >= _WORD_ID_BASE:
        end -= 1
    return list(ids[:end])


def token_text(token_id: int) -> str:
    """Text of a generated token id (from `filler_ids`)."""
    return _WORDS[(token_id - _WORD_ID_BASE) % len(_WORDS)]


def filler_text(ids: Sequence[int]) -> str:
    return "".join(token_text(i) for i in ids)
