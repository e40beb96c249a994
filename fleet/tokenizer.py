"""Tokenizer: a model folder's tokenizer and chat template, giving the prompt token ids the engine computes.

A gateway that routes on KV-cache blocks and an engine that hashes them must agree on every prompt token id, so
both load the same folder with `load_tokenizer` and compute ids the way vLLM does:

* Files, found as Hugging Face transformers finds them: ``tokenizer.json`` (loaded with
  ``tokenizers.Tokenizer.from_file``); the chat template from ``chat_template.jinja`` when present, else the
  ``chat_template`` string of ``tokenizer_config.json`` (a list of named templates picks ``default``); the
  special tokens (``bos_token``, ``eos_token``, ...) from ``tokenizer_config.json``, as strings or as
  ``{"content": ...}`` objects.
* Rendering, as transformers' ``src/transformers/utils/chat_template_utils.py`` (``_compile_jinja_template``)
  does: an ``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the ``loopcontrols``
  extension, a ``raise_exception`` global, ``strftime_now`` and a ``tojson`` filter that does not escape HTML;
  the template sees ``messages``, ``add_generation_prompt``, ``tools``, ``documents`` and the special tokens
  (``template_kwargs = {**self.special_tokens_map, **kwargs}`` in ``tokenization_utils_base.py``).
* ``continue_final_message``: the rendering is cut right after the final message's content, found with
  ``rendered.rindex(content.strip())`` (transformers' ``apply_chat_template``), so the model continues it.
* Content parts: a list of ``{"type": "text", "text": ...}`` is joined with newlines into one string before
  rendering, as vLLM does for a template that takes string content (``"\\n".join(texts)`` in
  ``_parse_chat_message_content_parts``, ``vllm/entrypoints/chat_utils.py``).
* Chat ids: ``encode(render_chat(...), add_special_tokens=False)``. vLLM renders with ``tokenize=False``
  (``apply_hf_chat_template``, ``vllm/entrypoints/chat_utils.py``) and tokenizes with the request's
  ``add_special_tokens``, whose default is false for chat (``ChatCompletionRequest``,
  ``vllm/entrypoints/openai/chat_completion/protocol.py``: "the chat template takes care of adding the special
  tokens") and true for completions (``CompletionRequest``, ``vllm/entrypoints/openai/completion/protocol.py``).

Errors: `TokenizerError` for a missing or broken file (the message names the file and what is wrong);
`ChatRenderError` for a conversation the template refuses or cannot render (a client's mistake: a 400).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

__all__ = ["TOKENIZER_FILES", "ChatRenderError", "ModelTokenizer", "TokenizerError", "load_tokenizer"]

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
# Every file `load_tokenizer` reads: a copy of these from a model folder tokenizes as the folder does.
TOKENIZER_FILES = (TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE)
# The special tokens transformers puts in a template's scope (`SpecialTokensMixin.SPECIAL_TOKENS_ATTRIBUTES`).
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TokenizerError(ValueError):
    """A tokenizer folder's file is missing or broken; the message names the file and the fault."""


class ChatRenderError(ValueError):
    """A conversation the chat template refuses (``raise_exception``) or that cannot be rendered."""


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers replaces jinja's own filter, which escapes HTML characters.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile(source: str, where: Path) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TokenizerError(f"{where}: the chat template does not compile: {exc} (line {exc.lineno})") from None


def _text_content(content: Any) -> str:
    """A message's content as the template gets it: text parts joined with newlines, None as empty text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatRenderError(f"only text content parts are supported, got {part!r}")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ChatRenderError(f"message content must be a string or a list of content parts, got {type(content).__name__}")


class ModelTokenizer:
    """One folder's tokenizer and chat template (`load_tokenizer` builds it).

    Invariant: ``chat_ids(m, ...) == encode(render_chat(m, ...))``, so any process holding the same folder
    computes the same prompt ids for the same conversation.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None,
        special_tokens: Mapping[str, Any],
        *,
        template_source: Path,
    ) -> None:
        self._tokenizer = tokenizer
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens)
        self._template_source = template_source
        self._template = None if chat_template is None else _compile(chat_template, template_source)

    @property
    def bos_token(self) -> str | None:
        value = self.special_tokens.get("bos_token")
        return value if isinstance(value, str) else None

    @property
    def eos_token(self) -> str | None:
        value = self.special_tokens.get("eos_token")
        return value if isinstance(value, str) else None

    @property
    def vocab_size(self) -> int:
        """Vocabulary size, added tokens included."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the tokenizer's post-processor (e.g. a BOS)."""
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_id(self, piece: str) -> int | None:
        """The id of ``piece`` when that text is exactly one token (``" the"``, ``"<|im_end|>"``); else None."""
        ids = self.encode(piece)
        return ids[0] if len(ids) == 1 and self.decode(ids) == piece else None

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str:
        """The prompt text of ``messages``; ChatRenderError when the template refuses them or there is none."""
        if self._template is None:
            raise ChatRenderError(
                f"{self._template_source}: no chat template (neither {TEMPLATE_FILE} nor a chat_template key)"
            )
        if continue_final_message and add_generation_prompt:
            raise ChatRenderError("continue_final_message and add_generation_prompt are not compatible")
        if not messages:
            raise ChatRenderError("no messages to render")
        conversation = [{**m, "content": _text_content(m.get("content"))} for m in messages]
        scope = {**self.special_tokens, "tools": None, "documents": None}
        try:
            rendered = self._template.render(
                messages=conversation, add_generation_prompt=add_generation_prompt, **scope
            )
        except jinja2.TemplateError as exc:
            raise ChatRenderError(str(exc)) from None
        if continue_final_message:
            rendered = _cut_after_final(rendered, conversation[-1]["content"])
        return rendered

    def chat_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """Prompt ids of a chat completion: the rendering tokenized without special tokens unless the request asks
        for them (``add_special_tokens``, false by default as in vLLM)."""
        text = self.render_chat(
            messages, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message
        )
        return self.encode(text, add_special_tokens=add_special_tokens)


def _cut_after_final(rendered: str, final: str) -> str:
    """``rendered`` up to the end of the final message's content (transformers' rule: the last occurrence of the
    stripped content; its leading spaces kept when the template kept them, else only the stripped text)."""
    stripped = final.strip()
    if stripped not in rendered:
        raise ChatRenderError("continue_final_message: the final message does not appear in the rendered chat")
    at = rendered.rindex(stripped)
    if rendered[at : at + len(final.lstrip())] == final:
        return rendered[: at + len(final.lstrip())]
    return rendered[: at + len(stripped)]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _special_tokens(config: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The template's special-token variables: strings, or ``{"content": ...}`` objects; null means none."""
    out: dict[str, Any] = {}
    for key in _SPECIAL_KEYS:
        value = config.get(key)
        if isinstance(value, Mapping):
            value = value.get("content")
        if value is None:
            continue
        if not isinstance(value, str):
            raise TokenizerError(f"{path}: {key} must be a string or an object with a string content")
        out[key] = value
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        out["additional_special_tokens"] = [t.get("content") if isinstance(t, Mapping) else t for t in extra]
    return out


def _template_from_config(config: Mapping[str, Any], path: Path) -> str | None:
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):  # named templates: transformers uses the one named "default"
        for entry in value:
            if isinstance(entry, Mapping) and entry.get("name") == "default" and isinstance(entry.get("template"), str):
                return str(entry["template"])
        raise TokenizerError(f"{path}: chat_template is a list without a template named 'default'")
    raise TokenizerError(f"{path}: chat_template must be a string, got {type(value).__name__}")


def load_tokenizer(folder: Path) -> ModelTokenizer:
    """The tokenizer and chat template in ``folder``; TokenizerError naming the file when one is missing or broken.

    ``tokenizer.json`` is required; ``tokenizer_config.json`` and ``chat_template.jinja`` are optional (without a
    template the tokenizer still encodes, and `ModelTokenizer.render_chat` refuses)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TokenizerError(f"{folder}: not a directory")
    tokenizer_path = folder / TOKENIZER_FILE
    if not tokenizer_path.is_file():
        raise TokenizerError(f"{tokenizer_path}: missing (a tokenizer folder needs {TOKENIZER_FILE})")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as exc:  # tokenizers raises a bare Exception for any malformed file
        raise TokenizerError(f"{tokenizer_path}: not a valid tokenizers file: {exc}") from None
    config_path = folder / CONFIG_FILE
    config = _read_json(config_path) if config_path.exists() else {}
    template_path = folder / TEMPLATE_FILE
    if template_path.exists():
        try:
            template: str | None = template_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{template_path}: cannot be read: {exc}") from None
        source = template_path
    else:
        template, source = _template_from_config(config, config_path), config_path
    return ModelTokenizer(tokenizer, template, _special_tokens(config, config_path), template_source=source)
