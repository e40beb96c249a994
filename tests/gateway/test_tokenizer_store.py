"""Tokenizer store: a pool's tokenizer fetched from the model bucket tokenizes as the folder it was pushed from, and
a store that cannot provide it says which bucket and key, and costs the pool its kv-cache scoring, never the start.

S3 is moto's server (`moto_url`), reached over HTTP as boto3 reaches AWS; the repository's tiny tokenizer is pushed
with the real `llmfleet.commands.model.push`.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from fleet.protocol.model_manifest import ModelKeys, scan_directory
from fleet.protocol.ports import free_port
from fleet.spec.stack import FleetSpec
from fleet.tokenizer import load_tokenizer
from gateway.body import parse_body
from gateway.prompt_tokens import PromptTokens
from gateway.tokenizer_store import (
    StoreUnreachable,
    TokenizerSource,
    TokenizerStore,
    TokenizerStoreError,
    fetch_all,
    store_tokenizers,
    wanted,
)
from llmfleet.commands.model import push
from tests.support.stacks import spec

FOLDER = Path("models/llmfleet-tiny-tokenizer")
MODEL = "Qwen/Qwen2.5-7B-Instruct"  # the preset pools' model
KEYS = ModelKeys("models", MODEL, "main")
KV_ROUTING = {"scorers": [{"name": "queue-depth", "weight": 1}, {"name": "kv-cache", "weight": 2}]}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a tide?"}]
_buckets = itertools.count()


class CountingS3:
    """A boto3 S3 client and its ``bucket``, recording the keys of its ``get_object`` calls."""

    def __init__(self, client: Any, bucket: str) -> None:
        self.client, self.bucket = client, bucket
        self.gets: list[str] = []

    def get_object(self, **kwargs: Any) -> Any:
        self.gets.append(kwargs["Key"])
        return self.client.get_object(**kwargs)


def client_for(url: str) -> Any:
    config = Config(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=2, read_timeout=5)
    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=config,
    )


@pytest.fixture
def s3(moto_url: str) -> CountingS3:
    """A fresh bucket on the module's moto server. moto keeps its buckets per process, not per server, so the
    name is this module's own: another module's ``models-N`` in the same test worker may hold a pushed model."""
    client, bucket = client_for(moto_url), f"tokenizer-store-{next(_buckets)}"
    client.create_bucket(Bucket=bucket)
    return CountingS3(client, bucket)


def source(s3: CountingS3, tmp_path: Path) -> TokenizerSource:
    return TokenizerSource(s3.bucket, "models", tmp_path / "cache")


def push_folder(s3: CountingS3, folder: Path, keys: ModelKeys = KEYS) -> None:
    manifest = scan_directory(folder, keys.model, keys.revision)
    push(s3.client, s3.bucket, keys, folder, manifest, part_size=5 * 1024 * 1024)


def kv_spec(**overrides: Any) -> FleetSpec:
    """The gateway preset routed by kv-cache, both pools (one model) with KV events and no tokenizer folder."""
    kv = {"pools.0.engine.kvEvents": True, "pools.1.engine.kvEvents": True}
    return spec("gateway", **{"gateway.routing": KV_ROUTING, **kv, **overrides})


def ids(tokens: PromptTokens, pool: str, body: dict[str, Any], kind: str = "chat") -> tuple[int, ...] | None:
    return tokens.ids(pool, parse_body(json.dumps({"model": "m", **body}).encode(), kind))  # type: ignore[arg-type]


def test_the_fetched_tokenizer_gives_the_token_ids_of_the_folder_it_was_pushed_from(
    s3: CountingS3, tmp_path: Path
) -> None:
    push_folder(s3, FOLDER)
    stack = kv_spec()
    fetched = store_tokenizers(stack, source(s3, tmp_path), s3)
    assert set(fetched) == {"qwen-7b", "small"}
    assert s3.gets.count(KEYS.manifest) == 1  # two pools of one model revision: fetched once
    tokens = PromptTokens(stack.pools, fetched)
    local = load_tokenizer(FOLDER)
    for pool in ("qwen-7b", "small"):
        assert ids(tokens, pool, {"messages": MESSAGES}) == tuple(local.chat_ids(MESSAGES))
        expected = tuple(local.encode("Once upon a time", add_special_tokens=True))
        assert ids(tokens, pool, {"prompt": "Once upon a time"}, "completion") == expected
    # Only what the tokenizer reads: not the corpus pushed beside it.
    cached = tmp_path / "cache" / MODEL / "main"
    assert sorted(p.name for p in cached.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]


def test_a_second_start_finds_the_files_in_the_cache_and_reads_only_the_manifest(
    s3: CountingS3, tmp_path: Path
) -> None:
    push_folder(s3, FOLDER)
    store = TokenizerStore(s3, source(s3, tmp_path))
    folder = store.fetch(MODEL, "main")
    stale = folder / "chat_template.jinja"  # left by an earlier push: it would override the config's template
    stale.write_text("{{ 'stale' }}")
    s3.gets.clear()
    assert store.fetch(MODEL, "main") == folder
    assert s3.gets == [KEYS.manifest]
    assert not stale.exists()


def test_a_file_whose_sha256_differs_from_the_manifest_is_refused_naming_its_key(
    s3: CountingS3, tmp_path: Path
) -> None:
    push_folder(s3, FOLDER)
    tampered = (FOLDER / "tokenizer.json").read_bytes().replace(b"<|im_end|>", b"<|im_xxx|>")
    s3.client.put_object(Bucket=s3.bucket, Key=KEYS.file("tokenizer.json"), Body=tampered)
    store = TokenizerStore(s3, source(s3, tmp_path))
    url = f"s3://{s3.bucket}/{KEYS.file('tokenizer.json')}"
    with pytest.raises(TokenizerStoreError, match=f"^{url}: sha256 [0-9a-f]{{64}}, but .*manifest.json says"):
        store.fetch(MODEL, "main")
    folder = tmp_path / "cache" / MODEL / "main"
    assert not (folder / "tokenizer.json").exists() and not (folder / "tokenizer.json.partial").exists()
    assert store_tokenizers(kv_spec(), source(s3, tmp_path), s3) == {}  # the pools: routed without kv-cache


def test_a_model_that_was_never_pushed_names_the_missing_manifest(s3: CountingS3, tmp_path: Path) -> None:
    store = TokenizerStore(s3, source(s3, tmp_path))
    url = f"s3://{s3.bucket}/{KEYS.manifest}"
    with pytest.raises(TokenizerStoreError, match=f"^{url} is missing: {MODEL} revision main was not pushed") as caught:
        store.fetch(MODEL, "main")
    assert "llmfleet model push" in str(caught.value)
    assert not isinstance(caught.value, StoreUnreachable)


def test_a_model_pushed_without_a_tokenizer_json_is_refused(s3: CountingS3, tmp_path: Path) -> None:
    slow_only = tmp_path / "model"
    slow_only.mkdir()
    shutil.copy(FOLDER / "tokenizer_config.json", slow_only)
    (slow_only / "tokenizer.model").write_bytes(b"sentencepiece")
    push_folder(s3, slow_only)
    with pytest.raises(TokenizerStoreError, match=r"manifest\.json lists no tokenizer\.json"):
        TokenizerStore(s3, source(s3, tmp_path)).fetch(MODEL, "main")


def test_an_unreachable_bucket_is_tried_once_and_named(tmp_path: Path) -> None:
    s3 = CountingS3(client_for(f"http://127.0.0.1:{free_port()}"), "llmfleet-prod-models-x")  # nothing listens there
    store = TokenizerStore(s3, source(s3, tmp_path))
    with pytest.raises(StoreUnreachable, match="^cannot reach the model bucket llmfleet-prod-models-x: models/"):
        store.fetch(MODEL, "main")
    s3.gets.clear()
    stack = kv_spec(**{"pools.1.model": "meta-llama/Llama-3.1-8B-Instruct"})  # two model revisions
    assert fetch_all(store, wanted(stack)) == {}
    assert len(s3.gets) == 1  # the second pool's fetch would have failed the same way: not tried


@pytest.mark.parametrize(
    ("overrides", "pools"),
    [
        pytest.param({}, ["qwen-7b", "small"], id="kv-cache and kv events"),
        pytest.param({"pools.1.engine.kvEvents": False}, ["qwen-7b"], id="a pool without kv events"),
        pytest.param({"pools.0.engine.tokenizer": str(FOLDER)}, ["small"], id="a pool with its own folder"),
        pytest.param({"gateway.routing": {"scorers": [{"name": "queue-depth"}]}}, [], id="no kv-cache"),
    ],
)
def test_only_pools_routed_by_kv_cache_with_events_and_no_folder_are_fetched(
    overrides: dict[str, Any], pools: list[str]
) -> None:
    assert [p.name for p in wanted(kv_spec(**overrides))] == pools
