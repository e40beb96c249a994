"""Prompt tokens: the gateway tokenizes a request's prompt exactly as the engine simulator does with the same
tokenizer folder, and gives up (None) rather than fail on a prompt it cannot tokenize."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, processors

from fleet.tokenizer import TokenizerError, load_tokenizer
from gateway.body import parse_body
from gateway.prompt_tokens import PromptTokens
from tests.support.stacks import pool

FOLDER = "models/llmfleet-tiny-tokenizer"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a tide?"}]


def _ids(body: dict[str, Any], kind: str = "chat") -> tuple[int, ...] | None:
    tokens = PromptTokens([pool("local-sim", **{"engine.tokenizer": FOLDER})])
    name = pool("local-sim").name
    return tokens.ids(name, parse_body(json.dumps({"model": "m", **body}).encode(), kind))  # type: ignore[arg-type]


def test_chat_and_completion_prompts_are_the_tokenizers_own_ids() -> None:
    tokenizer = load_tokenizer(Path(FOLDER))
    assert _ids({"messages": MESSAGES}) == tuple(tokenizer.chat_ids(MESSAGES))
    continued = [*MESSAGES, {"role": "assistant", "content": "The sea"}]
    body = {"messages": continued, "add_generation_prompt": False, "continue_final_message": True}
    assert _ids(body) == tuple(tokenizer.chat_ids(continued, add_generation_prompt=False, continue_final_message=True))
    assert _ids({"prompt": "Once upon"}, "completion") == tuple(tokenizer.encode("Once upon", add_special_tokens=True))
    assert _ids({"prompt": [5, 6, 7]}, "completion") == (5, 6, 7)


def test_a_chat_request_asking_for_special_tokens_gets_them_as_the_engine_adds_them(tmp_path: Path) -> None:
    # The shipped tokenizer adds none; a copy whose post-processor puts a BOS first tells the two apart.
    shutil.copy(Path(FOLDER) / "tokenizer_config.json", tmp_path)
    with_bos = Tokenizer.from_file(str(Path(FOLDER) / "tokenizer.json"))
    with_bos.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    with_bos.save(str(tmp_path / "tokenizer.json"))
    tokens = PromptTokens([pool("local-sim", **{"engine.tokenizer": str(tmp_path)})])
    name = pool("local-sim").name

    def ids(**extra: object) -> tuple[int, ...] | None:
        return tokens.ids(name, parse_body(json.dumps({"model": "m", "messages": MESSAGES, **extra}).encode(), "chat"))

    plain, special = ids(), ids(add_special_tokens=True)
    assert plain is not None and special == (0, *plain)


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "chat"),
        ({"prompt": ["one", "two"]}, "completion"),  # a batch is not scored
    ],
)
def test_a_prompt_it_cannot_tokenize_gets_no_ids_not_an_error(body: dict[str, Any], kind: str) -> None:
    assert _ids(body, kind) is None


def test_a_pool_without_a_tokenizer_gets_none_and_a_bad_folder_fails_at_start(tmp_path: Path) -> None:
    plain = pool("local-sim")
    assert plain.name not in PromptTokens([plain])
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        PromptTokens([pool("local-sim", **{"engine.tokenizer": str(tmp_path)})])


def test_a_pools_own_folder_comes_before_a_tokenizer_from_the_model_store(tmp_path: Path) -> None:
    shutil.copy(Path(FOLDER) / "tokenizer_config.json", tmp_path)
    with_bos = Tokenizer.from_file(str(Path(FOLDER) / "tokenizer.json"))
    with_bos.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    with_bos.save(str(tmp_path / "tokenizer.json"))
    fetched = {pool("local-sim").name: load_tokenizer(tmp_path)}
    body = parse_body(json.dumps({"model": "m", "prompt": "Once upon"}).encode(), "completion")
    own = PromptTokens([pool("local-sim", **{"engine.tokenizer": FOLDER})], fetched)
    store = PromptTokens([pool("local-sim")], fetched)
    name = pool("local-sim").name
    assert own.ids(name, body) == tuple(load_tokenizer(Path(FOLDER)).encode("Once upon", add_special_tokens=True))
    assert store.ids(name, body) == (0, *(own.ids(name, body) or ()))
