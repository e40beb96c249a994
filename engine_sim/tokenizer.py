"""Tokenizer: the simulator's tokenizers, an approximate one (the default) and a model folder's (``--tokenizer``).

`SimTokenizer` is what the simulator asks of a tokenizer: prompt ids (``encode``, ``chat_prompt_ids``) and the
filler vocabulary it generates from. `ApproxTokenizer` is a deterministic approximation of a BPE tokenizer with
consistent counts: ``encode(text)`` splits text into pieces (an optional leading space plus up to six letters, up
to three digits, one other character, or a run of whitespace) and maps each piece to a stable id in
``[0, VOCAB_SIZE)``. Chat messages are rendered with a ChatML template whose markers count as one token each; a
message's content is tokenized on its own, as a BPE pre-tokenizer splits it from the template around it.
Roughly 1.3 tokens per English word, like real BPE. `FileTokenizer` computes the ids a real engine computes
from a tokenizer folder (`fleet.tokenizer`), so KV-event block hashes match a gateway's using the same folder.

Generated text is filler made of one-token words (`FILLER_WORDS`); each tokenizer's filler ids are its ids of
those words (the approximate one's are the top 35 ids of its range, a file tokenizer's are its vocabulary ids),
so ``encode(filler_text(ids)) == ids`` and ``usage`` always matches what a client would count. The word at
sequence position P (prompt tokens first) depends only on the seed and P (``filler_ids``): text the model
generated, sent back as the end of a prompt (a chat's final assistant message with ``continue_final_message``,
or a completion's prompt), is continued exactly where it stopped, with no gap and no repeat.

The module-level functions are the default (approximate) tokenizer's, for callers that need no other.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleet.tokenizer import ModelTokenizer, TokenizerError, load_tokenizer

__all__ = [
    "APPROX",
    "FILLER_WORDS",
    "VOCAB_SIZE",
    "ApproxTokenizer",
    "FileTokenizer",
    "SimTokenizer",
    "chat_prompt_ids",
    "encode",
    "filler_ids",
    "filler_text",
    "load_file_tokenizer",
    "strip_generated",
    "token_text",
]

VOCAB_SIZE = 151_000
_SPECIAL = ("<|im_start|>", "<|im_end|>")
_PIECE = re.compile(r"<\|im_start\|>|<\|im_end\|>| ?[A-Za-z]{1,6}| ?\d{1,3}|\s+|.", re.DOTALL)

# One-token filler words (each matches `` ?[A-Za-z]{1,6}`` exactly once).
FILLER_WORDS = (
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
_WORD_ID_BASE = VOCAB_SIZE - len(FILLER_WORDS)
_WORD_IDS = {word: _WORD_ID_BASE + i for i, word in enumerate(FILLER_WORDS)}


class SimTokenizer:
    """Prompt ids and the filler vocabulary. Subclasses give ``encode`` and ``chat_prompt_ids``; the filler
    methods work on ``filler_vocab``, the tokenizer's ids of `FILLER_WORDS` in that order (all distinct)."""

    def __init__(self, filler_vocab: Sequence[int]) -> None:
        self.filler_vocab = tuple(filler_vocab)
        self._filler_set = frozenset(self.filler_vocab)
        self._filler_text = dict(zip(self.filler_vocab, FILLER_WORDS, strict=True))

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        raise NotImplementedError

    def chat_prompt_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
        add_special_tokens: bool = False,
    ) -> list[int]:
        raise NotImplementedError

    def filler_ids(self, seed: int, start: int, count: int) -> list[int]:
        """``count`` generated token ids for sequence positions ``start..start+count-1`` (the prompt's tokens are
        positions ``0..len(prompt)-1``). A function of ``seed`` and the position only: period 35 x 35 tokens."""
        vocab, n = self.filler_vocab, len(self.filler_vocab)
        return [vocab[(seed * 7 + (start + i) * 13 + (start + i) // n) % n] for i in range(count)]

    def strip_generated(self, ids: Sequence[int]) -> list[int]:
        """``ids`` without their trailing run of filler ids: the prompt as it was before any text the model may
        have generated (and was sent back to be continued) was appended to it."""
        end = len(ids)
        while end > 0 and ids[end - 1] in self._filler_set:
            end -= 1
        return list(ids[:end])

    def token_text(self, token_id: int) -> str:
        """Text of a generated token id (from ``filler_ids``)."""
        return self._filler_text[token_id]

    def filler_text(self, ids: Sequence[int]) -> str:
        return "".join(self.token_text(i) for i in ids)


def _piece_id(piece: str) -> int:
    found = _WORD_IDS.get(piece)
    return found if found is not None else zlib.crc32(piece.encode()) % _WORD_ID_BASE


class ApproxTokenizer(SimTokenizer):
    """The default: no files, deterministic across processes and runs (the module docstring's rules)."""

    def __init__(self) -> None:
        super().__init__(range(_WORD_ID_BASE, VOCAB_SIZE))

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        del add_special_tokens  # Unused: no BOS.
        return [_piece_id(p) for p in _PIECE.findall(text)]

    def chat_prompt_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """Token ids of a ChatML rendering of ``messages``, then the assistant generation prompt when
        ``add_generation_prompt``. ``continue_final`` leaves the last message open (no end marker), for the model
        to continue it; the caller checks that it is an assistant message and that no generation prompt follows.
        There is no BOS, so ``add_special_tokens`` changes nothing."""
        del add_special_tokens  # Unused.
        ids: list[int] = []
        last = len(messages) - 1
        for i, message in enumerate(messages):
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts: keep the text parts
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            ids += self.encode(f"{_SPECIAL[0]}{message.get('role', 'user')}\n") + self.encode(str(content or ""))
            if not (continue_final and i == last):
                ids += self.encode(f"{_SPECIAL[1]}\n")
        if add_generation_prompt:
            ids += self.encode(f"{_SPECIAL[0]}assistant\n")
        return ids

    def token_text(self, token_id: int) -> str:
        # Any id maps to a word (callers have always relied on it for generated ids only).
        return FILLER_WORDS[(token_id - _WORD_ID_BASE) % len(FILLER_WORDS)]


class FileTokenizer(SimTokenizer):
    """A tokenizer folder's ids (`fleet.tokenizer`): chat prompts rendered with the folder's template and
    tokenized as vLLM does; the filler ids are the vocabulary ids of `FILLER_WORDS`."""

    def __init__(self, model: ModelTokenizer, folder: Path) -> None:
        self.model = model
        ids = []
        for word in FILLER_WORDS:
            found = model.token_id(word)
            if found is None:
                raise TokenizerError(
                    f"{folder}: the filler word {word!r} is not one token of this tokenizer "
                    f"(it encodes as {model.encode(word)}); the simulator generates only one-token words"
                )
            ids.append(found)
        if model.encode("".join(FILLER_WORDS)) != ids:
            raise TokenizerError(f"{folder}: the filler words do not encode one token each when run together")
        super().__init__(ids)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self.model.encode(text, add_special_tokens=add_special_tokens)

    def chat_prompt_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
        add_special_tokens: bool = False,
    ) -> list[int]:
        return self.model.chat_ids(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final,
            add_special_tokens=add_special_tokens,
        )


def load_file_tokenizer(folder: Path) -> FileTokenizer:
    """``--tokenizer PATH``: TokenizerError naming the file when the folder cannot serve the simulator."""
    return FileTokenizer(load_tokenizer(folder), folder)


APPROX = ApproxTokenizer()


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (deterministic across processes and runs)."""
    return APPROX.encode(text)


def chat_prompt_ids(
    messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = True, continue_final: bool = False
) -> list[int]:
    """`ApproxTokenizer.chat_prompt_ids`."""
    return APPROX.chat_prompt_ids(messages, add_generation_prompt=add_generation_prompt, continue_final=continue_final)


def filler_ids(seed: int, start: int, count: int) -> list[int]:
    """`SimTokenizer.filler_ids` of the default tokenizer."""
    return APPROX.filler_ids(seed, start, count)


def strip_generated(ids: Sequence[int]) -> list[int]:
    """`SimTokenizer.strip_generated` of the default tokenizer."""
    return APPROX.strip_generated(ids)


def token_text(token_id: int) -> str:
    """Text of a generated token id (from `filler_ids`)."""
    return APPROX.token_text(token_id)


def filler_text(ids: Sequence[int]) -> str:
    return APPROX.filler_text(ids)
