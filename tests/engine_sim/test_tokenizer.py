"""The tokenizer approximation: deterministic, and generated text re-tokenizes to its own count."""

from __future__ import annotations

import pytest

from engine_sim.tokenizer import chat_prompt_ids, encode, filler_ids, filler_text


@pytest.mark.parametrize(
    ("text", "count"),
    [("", 0), ("hello", 1), ("hello world", 2), ("internationalization", 4), ("a, b.", 4), ("12345", 2)],
)
def test_encode_counts(text: str, count: int) -> None:
    assert len(encode(text)) == count


def test_encode_is_deterministic() -> None:
    assert encode("The quick brown fox") == encode("The quick brown fox")


@pytest.mark.parametrize("count", [1, 7, 100, 1000])
def test_generated_text_has_as_many_tokens_as_ids(count: int) -> None:
    ids = filler_ids(seed=3, start=0, count=count)
    assert len(encode(filler_text(ids))) == count


def test_chat_prompts_sharing_a_system_message_share_a_token_prefix() -> None:
    system = {"role": "system", "content": "You are terse. " * 50}
    a = chat_prompt_ids([system, {"role": "user", "content": "first question"}])
    b = chat_prompt_ids([system, {"role": "user", "content": "another one"}])
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert common > 150
