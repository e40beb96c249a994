"""The shared tokenizer: loading a folder, encoding, chat rendering as transformers does, and errors naming files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fleet.tokenizer import ChatRenderError, ModelTokenizer, TokenizerError, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "models" / "llmfleet-tiny-tokenizer"
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about caches."}]
CHATML = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTell me about caches.<|im_end|>\n"


@pytest.fixture(scope="module")
def tiny() -> ModelTokenizer:
    return load_tokenizer(TINY)


def _folder(tmp_path: Path, config: dict[str, Any] | None = None, template: str | None = None) -> Path:
    """A copy of the tiny tokenizer with its own tokenizer_config.json and chat_template.jinja."""
    shutil.copy(TINY / "tokenizer.json", tmp_path / "tokenizer.json")
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if template is not None:
        (tmp_path / "chat_template.jinja").write_text(template)
    return tmp_path


@pytest.mark.parametrize(
    "text",
    ["Tell me about caches.", "  indented\n\ttabs and  spaces ", "ünïcödé ✓ 日本語", "<|im_start|>user\nhi<|im_end|>"],
)
def test_encode_then_decode_gives_the_text_back(tiny: ModelTokenizer, text: str) -> None:
    ids = tiny.encode(text)
    assert ids and all(isinstance(i, int) for i in ids)
    assert tiny.decode(ids) == text


def test_special_tokens_are_one_token_each_and_text_is_not(tiny: ModelTokenizer) -> None:
    assert [tiny.token_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert tiny.token_id(" the") is not None
    assert tiny.token_id(" the cache") is None
    assert tiny.eos_token == "<|im_end|>" and tiny.bos_token is None


def test_a_system_and_user_conversation_renders_as_chatml(tiny: ModelTokenizer) -> None:
    assert tiny.render_chat(CONVERSATION) == CHATML + "<|im_start|>assistant\n"
    assert tiny.render_chat(CONVERSATION, add_generation_prompt=False) == CHATML


def test_chat_ids_are_the_rendering_encoded_without_special_tokens(tiny: ModelTokenizer) -> None:
    ids = tiny.chat_ids(CONVERSATION)
    assert ids == tiny.encode(CHATML + "<|im_start|>assistant\n")
    assert ids[0] == tiny.token_id("<|im_start|>") and ids[-4:] == tiny.encode("<|im_start|>assistant\n")
    assert tiny.chat_ids(CONVERSATION, add_generation_prompt=False) == tiny.encode(CHATML)


@pytest.mark.parametrize("prefix", [" the model", "Caches keep", "trailing space "])
def test_continue_final_message_cuts_right_after_the_final_content(tiny: ModelTokenizer, prefix: str) -> None:
    messages = [*CONVERSATION, {"role": "assistant", "content": prefix}]
    text = tiny.render_chat(messages, add_generation_prompt=False, continue_final_message=True)
    # The template keeps the content as it is: the cut is right after it, its spaces included.
    assert text == CHATML + "<|im_start|>assistant\n" + prefix


def test_continue_final_message_after_a_template_that_trims_content_cuts_after_the_text(tmp_path: Path) -> None:
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}"
    tok = load_tokenizer(_folder(tmp_path, {"chat_template": template}))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  Caches keep  "}]
    text = tok.render_chat(messages, add_generation_prompt=False, continue_final_message=True)
    assert text == "<user>hi</user><assistant>Caches keep"


def test_continue_final_message_with_a_generation_prompt_is_refused(tiny: ModelTokenizer) -> None:
    messages = [*CONVERSATION, {"role": "assistant", "content": "Caches"}]
    with pytest.raises(ChatRenderError, match="not compatible"):
        tiny.render_chat(messages, continue_final_message=True)


def test_text_content_parts_are_joined_with_newlines(tiny: ModelTokenizer) -> None:
    parts = [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "about caches."}]
    rendered = tiny.render_chat([{"role": "user", "content": parts}], add_generation_prompt=False)
    assert rendered == "<|im_start|>user\nTell me\nabout caches.<|im_end|>\n"
    with pytest.raises(ChatRenderError, match="only text content parts"):
        tiny.render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_the_template_sees_special_tokens_and_the_sandbox_helpers(tmp_path: Path) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad role') }}"
        "{% endif %}{{ m | tojson }}{{ eos_token }}\n{% endfor %}"
    )
    folder = _folder(tmp_path, {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": "x"}, template)
    tok = load_tokenizer(folder)  # chat_template.jinja wins over the config's chat_template
    assert tok.render_chat([{"role": "user", "content": "<é>"}]) == '<s>{"role": "user", "content": "<é>"}</s>\n'
    with pytest.raises(ChatRenderError, match="no bad role"):
        tok.render_chat([{"role": "bad", "content": ""}])


def test_trim_and_lstrip_blocks_are_on(tmp_path: Path) -> None:
    template = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}"
    tok = load_tokenizer(_folder(tmp_path, {"chat_template": template}))
    assert tok.render_chat([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "[a]\n[b]\n"


def test_without_a_template_rendering_names_the_missing_file(tmp_path: Path) -> None:
    tok = load_tokenizer(_folder(tmp_path))
    assert tok.encode("the") == load_tokenizer(TINY).encode("the")
    with pytest.raises(ChatRenderError, match="tokenizer_config.json: no chat template"):
        tok.render_chat(CONVERSATION)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, r"tokenizer\.json: missing"),
        ({"tokenizer.json": "{not json"}, r"tokenizer\.json: not a valid tokenizers file"),
        ({"tokenizer_config.json": "[1, 2"}, r"tokenizer_config\.json: not valid JSON"),
        ({"tokenizer_config.json": "[1, 2]"}, r"tokenizer_config\.json: expected a JSON object, got list"),
        ({"tokenizer_config.json": '{"eos_token": 3}'}, r"tokenizer_config\.json: eos_token must be a string"),
        ({"tokenizer_config.json": '{"chat_template": 3}'}, r"tokenizer_config\.json: chat_template must be a string"),
        ({"chat_template.jinja": "{% for %}"}, r"chat_template\.jinja: the chat template does not compile"),
    ],
    ids=["no-tokenizer", "bad-tokenizer", "bad-json", "not-object", "bad-eos", "bad-template-type", "bad-jinja"],
)
def test_a_missing_or_broken_file_is_named_in_the_error(tmp_path: Path, files: dict[str, str], message: str) -> None:
    if files:
        shutil.copy(TINY / "tokenizer.json", tmp_path / "tokenizer.json")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(TokenizerError, match=f"^{tmp_path}/{message}"):
        load_tokenizer(tmp_path)


def test_a_folder_that_is_not_there_is_named(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="not a directory"):
        load_tokenizer(tmp_path / "nope")
