"""The shipped tokenizer folder: what the build script makes, byte for byte, and the properties the simulator needs."""

from __future__ import annotations

import json

from engine_sim.tokenizer import FILLER_WORDS, load_file_tokenizer
from engine_sim.tokenizer_build import CORPUS_FILE, DEFAULT_OUT, SPECIAL_TOKENS, build_files, main
from fleet.tokenizer import load_tokenizer


def test_the_shipped_files_are_what_the_build_makes_from_the_shipped_corpus() -> None:
    built = build_files((DEFAULT_OUT / CORPUS_FILE).read_text(encoding="utf-8"))
    assert {name: (DEFAULT_OUT / name).read_bytes() == data for name, data in built.items()} == {
        name: True for name in built
    }
    assert main(["--check"]) == 0


def test_the_build_is_reproducible() -> None:
    corpus = "a small corpus about the fleet and its engine cache\n" * 50
    assert build_files(corpus) == build_files(corpus)


def test_the_shipped_tokenizer_is_small_with_a_vocabulary_of_some_thousands() -> None:
    assert (DEFAULT_OUT / "tokenizer.json").stat().st_size < 300_000
    tok = load_tokenizer(DEFAULT_OUT)
    assert 4_000 <= tok.vocab_size <= 8_000
    assert [tok.token_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]


def test_its_config_has_a_chatml_template_an_eos_and_no_bos() -> None:
    config = json.loads((DEFAULT_OUT / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["bos_token"] is None
    assert "<|im_start|>" in config["chat_template"]


def test_every_filler_word_is_one_token_and_they_encode_one_id_each_run_together() -> None:
    sim = load_file_tokenizer(DEFAULT_OUT)
    tok = sim.model
    ids = [tok.token_id(word) for word in FILLER_WORDS]
    assert None not in ids and len(set(ids)) == len(FILLER_WORDS) == 35
    assert tok.encode("".join(FILLER_WORDS)) == ids
    generated = sim.filler_ids(seed=5, start=100, count=300)
    assert tok.encode(sim.filler_text(generated)) == generated
