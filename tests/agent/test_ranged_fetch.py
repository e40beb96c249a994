"""Parallel ranged fetches of large model files against moto's S3 server (real HTTP, concurrent connections).

The model is pushed with the real `llmfleet.commands.model.push`; the fetcher's part size is 256 KiB, so the
1.375 MiB shard is six ranged GETs while the small files stay single GETs.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import random
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ResponseStreamingError

from agent import cli
from agent.metrics import AgentMetrics
from agent.model_store import ChecksumError, FetchCancelled, FetchError, ModelFetcher, StoreOptions
from agent.ranged_fetch import DEFAULT_CONCURRENCY, DEFAULT_PART_SIZE, missing_ranges, sidecar_path
from fleet.protocol.model_manifest import ModelKeys, scan_directory
from fleet.spec.stack import ModelStoreSpec
from llmfleet.commands.model import push
from tests.support.stacks import spec as stack_spec

MIB = 1024 * 1024
PART = 256 * 1024  # small parts keep the pushed shard small
KEYS = ModelKeys("models", "Qwen/Qwen2.5-7B-Instruct", "main")
SHARD = "model-00001-of-00001.safetensors"
FILES = {
    "config.json": b'{"architectures": ["Qwen2ForCausalLM"]}',
    SHARD: random.Random(0).randbytes(5 * PART + PART // 2),
    "tokenizer.json": b'{"version": "1.0"}',
}
TOTAL = sum(len(data) for data in FILES.values())
PARTS = [(start, min(start + PART, len(FILES[SHARD]))) for start in range(0, len(FILES[SHARD]), PART)]
_buckets = itertools.count()


class CountingS3:
    """A boto3 S3 client on moto's server that records every ``get_object`` and how many ran at once."""

    def __init__(self, client: Any, bucket: str) -> None:
        self.client, self.bucket = client, bucket
        self.gets: list[dict[str, Any]] = []
        self.on_get: Callable[[dict[str, Any]], None] | None = None
        self.delay_s = 0.0  # inside the counted call: lets the concurrent GETs overlap measurably
        self.cut: dict[str, int] = {}  # Range -> how many more of its bodies break off after one chunk
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()

    def get_object(self, **kwargs: Any) -> Any:
        with self._lock:
            self.gets.append(kwargs)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.on_get is not None:
                self.on_get(kwargs)
            time.sleep(self.delay_s)
            response = self.client.get_object(**kwargs)
            if self.cut.get(kwargs.get("Range", ""), 0):
                self.cut[kwargs["Range"]] -= 1
                response["Body"] = CutBody(response["Body"])
            return response
        finally:
            with self._lock:
                self.in_flight -= 1

    def shard_ranges(self) -> list[tuple[int, int]]:
        """The shard's GETs as [start, end) ranges, in the order they were sent."""
        ranges = []
        for get in self.gets:
            if get["Key"] == KEYS.file(SHARD):
                start, _, last = get["Range"].removeprefix("bytes=").partition("-")
                ranges.append((int(start), int(last) + 1))
        return ranges


class CutBody:
    """A response body whose connection resets after its first chunk."""

    def __init__(self, body: Any) -> None:
        self.body = body

    def iter_chunks(self, size: int) -> Iterator[bytes]:
        yield next(self.body.iter_chunks(size))
        raise ResponseStreamingError(error="Connection reset by peer")

    def close(self) -> None:
        self.body.close()


@pytest.fixture
def s3(moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CountingS3:
    """A fresh bucket on the module's server holding the pushed model."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1", config=Config(max_pool_connections=16))
    bucket = f"models-{next(_buckets)}"
    client.create_bucket(Bucket=bucket)
    root = tmp_path / "src"
    for path, data in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    push(client, bucket, KEYS, root, scan_directory(root, KEYS.model, KEYS.revision), part_size=5 * MIB)
    return CountingS3(client, bucket)


def fetcher(s3: CountingS3, cache: Path, *, concurrency: int = 4) -> ModelFetcher:
    metrics = AgentMetrics("r0", "qwen-7b")
    return ModelFetcher(s3, s3.bucket, KEYS, cache, metrics, lock_poll_s=0.01, concurrency=concurrency, part_size=PART)


def sample(f: ModelFetcher, name: str) -> float:
    return f.metrics.registry.get_sample_value(name, {}) or 0.0


def cancel_at(s3: CountingS3, f: ModelFetcher, part: int) -> None:
    """Cancel ``f`` when it asks for the shard's ``part``: earlier parts are complete, later ones not started."""
    wanted = f"bytes={PARTS[part][0]}-"
    s3.on_get = lambda get: f.cancel() if get.get("Range", "").startswith(wanted) else None


# ---- parallel and ranged --------------------------------------------------------------------------------------


def test_a_large_file_arrives_intact_from_concurrent_ranged_gets(s3: CountingS3, tmp_path: Path) -> None:
    s3.delay_s = 0.05
    f = fetcher(s3, tmp_path / "cache")
    assert f.fetch().source == "downloaded"
    shard = f.model_dir / SHARD
    assert hashlib.sha256(shard.read_bytes()).digest() == hashlib.sha256(FILES[SHARD]).digest()
    assert sorted(s3.shard_ranges()) == PARTS
    assert 2 <= s3.max_in_flight <= 4  # concurrent, and bounded by the pool
    small = [g for g in s3.gets if g["Key"] != KEYS.file(SHARD) and not g["Key"].endswith("manifest.json")]
    assert [("Range" in g) for g in small] == [False, False]
    assert sample(f, "llmfleet_agent_model_fetched_bytes_total") == f.bytes_fetched == TOTAL
    assert stat.S_IMODE(shard.stat().st_mode) == 0o444
    assert sorted(p.name for p in f.model_dir.iterdir()) == sorted(FILES)  # no partial, no sidecar left


def test_a_cancelled_fetch_resumes_with_only_the_missing_parts(s3: CountingS3, tmp_path: Path) -> None:
    first = fetcher(s3, tmp_path / "cache", concurrency=1)  # one worker: the parts go in order
    cancel_at(s3, first, 2)
    with pytest.raises(FetchCancelled):
        first.fetch()
    assert sidecar_path(first.model_dir / f"{SHARD}.partial").exists()
    s3.gets.clear()
    s3.on_get = None
    second = fetcher(s3, tmp_path / "cache")
    assert second.fetch().source == "downloaded"
    assert sorted(s3.shard_ranges()) == PARTS[2:]
    assert first.bytes_fetched + second.bytes_fetched == TOTAL  # no byte fetched twice
    assert (second.model_dir / SHARD).read_bytes() == FILES[SHARD]


def test_a_sequential_partial_counts_as_a_fetched_prefix(s3: CountingS3, tmp_path: Path) -> None:
    f = fetcher(s3, tmp_path / "cache")
    f.model_dir.mkdir(parents=True)
    prefix = 2 * PART + 1000  # left by a single-stream download
    (f.model_dir / f"{SHARD}.partial").write_bytes(FILES[SHARD][:prefix])
    f.fetch()
    assert sorted(s3.shard_ranges()) == [(prefix, 3 * PART), *PARTS[3:]]
    assert (f.model_dir / SHARD).read_bytes() == FILES[SHARD]


@pytest.mark.parametrize(("cuts", "arrives"), [(1, True), (2, True), (3, False)])
def test_a_body_cut_mid_range_is_fetched_again_twice_at_most(
    s3: CountingS3, tmp_path: Path, cuts: int, arrives: bool
) -> None:
    s3.cut = {f"bytes={PARTS[1][0]}-{PARTS[1][1] - 1}": cuts}
    f = fetcher(s3, tmp_path / "cache")
    if arrives:
        assert f.fetch().source == "downloaded"
        assert (f.model_dir / SHARD).read_bytes() == FILES[SHARD]
    else:
        with pytest.raises(FetchError, match=rf"^{SHARD}: s3://.* bytes {PARTS[1][0]}-.*reset by peer \(3 attempts\)"):
            f.fetch()
    assert s3.shard_ranges().count(PARTS[1]) == min(cuts + 1, 3)


def test_a_partial_of_a_re_pushed_file_is_started_over(s3: CountingS3, tmp_path: Path) -> None:
    first = fetcher(s3, tmp_path / "cache", concurrency=1)
    cancel_at(s3, first, 2)
    with pytest.raises(FetchCancelled):
        first.fetch()
    pushed = random.Random(1).randbytes(len(FILES[SHARD]))  # same size, other bytes
    root = tmp_path / "src"
    (root / SHARD).write_bytes(pushed)
    push(s3.client, s3.bucket, KEYS, root, scan_directory(root, KEYS.model, KEYS.revision), part_size=5 * MIB)
    s3.gets.clear()
    s3.on_get = None
    second = fetcher(s3, tmp_path / "cache")
    assert second.fetch().source == "downloaded"
    assert sorted(s3.shard_ranges()) == PARTS  # the old parts are not kept
    assert sample(second, "llmfleet_agent_model_checksum_failures_total") == 0
    assert (second.model_dir / SHARD).read_bytes() == pushed


# ---- checksums ------------------------------------------------------------------------------------------------


def test_a_corrupt_part_on_disk_is_caught_by_the_checksum_and_fetched_again(s3: CountingS3, tmp_path: Path) -> None:
    first = fetcher(s3, tmp_path / "cache", concurrency=1)
    cancel_at(s3, first, 3)
    with pytest.raises(FetchCancelled):
        first.fetch()
    partial = first.model_dir / f"{SHARD}.partial"
    with partial.open("r+b") as handle:  # a recorded part whose bytes did not survive (a node crash)
        handle.seek(PART + 10)
        handle.write(b"\x00" * 16)
    s3.on_get = None
    second = fetcher(s3, tmp_path / "cache")
    assert second.fetch().source == "downloaded"
    assert sample(second, "llmfleet_agent_model_checksum_failures_total") == 1
    assert (second.model_dir / SHARD).read_bytes() == FILES[SHARD]


def test_a_corrupt_object_fails_after_one_retry_naming_the_file(s3: CountingS3, tmp_path: Path) -> None:
    corrupt = bytearray(FILES[SHARD])
    corrupt[3 * PART + 7] ^= 0xFF  # same size: only the digest can tell
    s3.client.put_object(Bucket=s3.bucket, Key=KEYS.file(SHARD), Body=bytes(corrupt))
    f = fetcher(s3, tmp_path / "cache")
    with pytest.raises(ChecksumError, match=rf"^{SHARD}: sha256 does not match .* two downloads"):
        f.fetch()
    assert sorted(s3.shard_ranges()) == sorted(PARTS * 2)
    assert sample(f, "llmfleet_agent_model_checksum_failures_total") == 2
    assert not list(f.model_dir.glob(f"*{SHARD}*"))  # neither the file, its partial nor its sidecar


def test_an_object_of_another_size_fails_naming_the_range(s3: CountingS3, tmp_path: Path) -> None:
    s3.client.put_object(Bucket=s3.bucket, Key=KEYS.file(SHARD), Body=FILES[SHARD] + b"more")
    answered = rf"the store answered bytes \d+-\d+/{len(FILES[SHARD]) + 4}$"
    with pytest.raises(FetchError, match=rf"^{SHARD}: s3://.* bytes \d+-\d+: {answered}"):
        fetcher(s3, tmp_path / "cache").fetch()


# ---- ranges and settings --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "size", "done", "expected"),
    [
        ("nothing done", 10, [], [(0, 4), (4, 8), (8, 10)]),
        ("all done", 10, [(0, 10)], []),
        ("a prefix, then cut at part boundaries", 10, [(0, 5)], [(5, 8), (8, 10)]),
        ("holes between parts", 12, [(4, 8), (0, 4)], [(8, 12)]),
        ("a gap across a boundary", 12, [(0, 3), (5, 12)], [(3, 4), (4, 5)]),
        ("overlapping records", 10, [(0, 6), (2, 4), (8, 10)], [(6, 8)]),
        ("empty file", 0, [], []),
    ],
)
def test_missing_ranges_cover_exactly_what_is_not_done(
    name: str, size: int, done: list[tuple[int, int]], expected: list[tuple[int, int]]
) -> None:
    del name  # Unused: the test id.
    assert missing_ranges(size, done, 4) == expected


def test_the_stack_defaults_are_the_agents_defaults() -> None:
    spec = ModelStoreSpec()
    options = StoreOptions(bucket="b", prefix="models", cache_dir=Path("/models/store"))
    assert (spec.concurrency, spec.part_size_mib * MIB) == (options.concurrency, options.part_size)
    assert (options.concurrency, options.part_size) == (DEFAULT_CONCURRENCY, DEFAULT_PART_SIZE)
    assert ModelStoreSpec.model_validate({"concurrency": 8, "partSizeMib": 8}).part_size_mib == 8


def test_the_stacks_model_store_keys_reach_the_agent() -> None:
    spec = stack_spec("aws", **{"modelStore.concurrency": 8, "modelStore.partSizeMib": 32})
    options = cli.store_options(argparse.Namespace(model_bucket="b", model_cache=Path("/models/store")), spec)
    assert options is not None and (options.concurrency, options.part_size) == (8, 32 * MIB)
