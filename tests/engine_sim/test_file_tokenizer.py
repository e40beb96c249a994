"""``--tokenizer PATH``: prompt ids, KV events and generated text from a tokenizer folder, as a gateway loading the
same folder with `fleet.tokenizer` computes them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from engine_sim.cli import add_serve_arguments, build
from engine_sim.errors import ConfigError
from engine_sim.kv_events import KVEvent, KVEventsConfig, KVEventSettings
from engine_sim.tokenizer import APPROX, FileTokenizer, load_file_tokenizer
from engine_sim.tokenizer_build import DEFAULT_OUT
from fleet.tokenizer import TokenizerError, load_tokenizer
from tests.engine_sim.conftest import SimHandle, StartSim

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about caches."}]
LONG = [{"role": "user", "content": "Explain how the gateway routes requests to engines with warm caches. " * 4}]


@pytest.fixture(scope="module")
def sim_tok() -> FileTokenizer:
    return load_file_tokenizer(DEFAULT_OUT)


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(["Qwen/Qwen2.5-7B-Instruct", *flags])


def test_the_flag_loads_the_folder_and_without_it_the_approximate_tokenizer_counts() -> None:
    assert isinstance(build(_args("--tokenizer", str(DEFAULT_OUT))).settings.tokenizer, FileTokenizer)
    assert build(_args()).settings.tokenizer is APPROX


def test_a_folder_that_cannot_serve_fails_at_startup_naming_its_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^--tokenizer {tmp_path}: {tmp_path}/tokenizer\.json: missing"):
        build(_args("--tokenizer", str(tmp_path)))


def test_a_tokenizer_without_the_filler_words_as_single_tokens_is_refused(tmp_path: Path) -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["a b c"], trainer=trainer)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path).token_id(" the") is None
    with pytest.raises(TokenizerError, match=r"the filler word ' the' is not one token"):
        load_file_tokenizer(tmp_path)


async def _chat(sim: SimHandle, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    response = await sim.client.post(CHAT, json={"model": "qwen", "messages": messages, **extra})
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


async def test_a_chats_prompt_tokens_are_the_shared_tokenizers_chat_ids(
    start_sim: StartSim, sim_tok: FileTokenizer
) -> None:
    sim = await start_sim(tokenizer=sim_tok)
    shared = load_tokenizer(DEFAULT_OUT)
    for messages in (MESSAGES, LONG):
        usage = (await _chat(sim, messages, max_tokens=3))["usage"]
        assert usage["prompt_tokens"] == len(shared.chat_ids(messages))
        assert len(shared.chat_ids(messages)) != len(APPROX.chat_prompt_ids(messages))
    prompt = "Write about queues:"
    body = {"model": "qwen", "prompt": prompt, "max_tokens": 2}
    completion = (await sim.client.post("/v1/completions", json=body)).json()
    assert completion["usage"]["prompt_tokens"] == len(shared.encode(prompt, add_special_tokens=True))


async def test_the_kv_events_of_a_chat_carry_the_shared_tokenizers_ids(
    start_sim: StartSim, sim_tok: FileTokenizer
) -> None:
    events = KVEventSettings(KVEventsConfig(enable_kv_cache_events=True))
    sim = await start_sim(tokenizer=sim_tok, kv_events=events)
    batches: list[KVEvent] = []
    sim.engine.on_kv_events = lambda ts, batch: batches.extend(batch)
    await _chat(sim, LONG, max_tokens=1)
    ids = load_tokenizer(DEFAULT_OUT).chat_ids(LONG)
    stored = [e["token_ids"] for e in batches if e["type"] == "BlockStored"]
    full = len(ids) // 16 * 16
    assert full >= 32 and [t for block in stored for t in block] == ids[:full]


@pytest.mark.parametrize("cut", [1, 13, 39])
async def test_a_continued_chat_answer_goes_on_where_it_stopped(
    start_sim: StartSim, sim_tok: FileTokenizer, cut: int
) -> None:
    sim = await start_sim(tokenizer=sim_tok)
    whole = await _chat(sim, MESSAGES, max_tokens=40)
    ids = sim_tok.encode(whole["choices"][0]["message"]["content"])
    assert len(ids) == 40 and set(ids) <= set(sim_tok.filler_vocab)
    words = [sim_tok.token_text(i) for i in ids]
    messages = [*MESSAGES, {"role": "assistant", "content": "".join(words[:cut])}]
    rest = await _chat(sim, messages, max_tokens=40 - cut, continue_final_message=True, add_generation_prompt=False)
    assert rest["choices"][0]["message"]["content"] == "".join(words[cut:])
    assert rest["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] + cut
    assert rest["usage"]["prompt_tokens"] == len(
        load_tokenizer(DEFAULT_OUT).chat_ids(messages, add_generation_prompt=False, continue_final_message=True)
    )


async def test_a_continuation_without_max_tokens_stops_where_the_whole_answer_stops(
    start_sim: StartSim, sim_tok: FileTokenizer
) -> None:
    sim = await start_sim(tokenizer=sim_tok, time_scale=200.0)
    whole = await _chat(sim, MESSAGES)
    text = whole["choices"][0]["message"]["content"]
    ids = sim_tok.encode(text)
    assert whole["choices"][0]["finish_reason"] == "stop" and 16 <= len(ids) <= 512
    cut = len(ids) // 2
    messages = [*MESSAGES, {"role": "assistant", "content": sim_tok.filler_text(ids[:cut])}]
    rest = await _chat(sim, messages, continue_final_message=True, add_generation_prompt=False)
    assert rest["choices"][0]["message"]["content"] == sim_tok.filler_text(ids[cut:])
    assert rest["choices"][0]["finish_reason"] == "stop"
