"""Model store: the manifest and key layout, and fetching into the node cache (resume, checksums, the shared lock).

S3 is moto's in-process mock; the model is pushed with the real `llmfleet.commands.model.push`.
"""

from __future__ import annotations

import fcntl
import hashlib
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.metrics import AgentMetrics
from agent.model_store import ChecksumError, FetchCancelled, FetchError, FetchResult, ModelFetcher
from fleet.protocol.model_manifest import Manifest, ManifestError, ModelKeys, scan_directory
from llmfleet.commands.model import push
from tests.support.s3 import moto_s3
from tests.support.wait import wait_for

BUCKET = "models-test"
KEYS = ModelKeys("models", "Qwen/Qwen2.5-7B-Instruct", "main")
FILES = {
    "config.json": b'{"architectures": ["Qwen2ForCausalLM"]}',
    "model-00001-of-00001.safetensors": bytes(range(256)) * 4096,  # 1 MiB
    "tokenizer/vocab.txt": b"hello\nworld\n",
    "empty.txt": b"",
}
TOTAL = sum(len(data) for data in FILES.values())
SHA = "0" * 64


class RecordingS3:
    """A boto3 S3 client that remembers every ``get_object`` call's arguments."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.gets: list[dict[str, Any]] = []

    def get_object(self, **kwargs: Any) -> Any:
        self.gets.append(kwargs)
        return self.client.get_object(**kwargs)

    def file_gets(self) -> list[dict[str, Any]]:
        return [g for g in self.gets if not g["Key"].endswith("manifest.json")]


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingS3]:
    with moto_s3(monkeypatch, BUCKET) as client:
        yield RecordingS3(client)


def push_model(s3: RecordingS3, root: Path, files: dict[str, bytes] = FILES) -> Manifest:
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    manifest = scan_directory(root, KEYS.model, KEYS.revision)
    push(s3.client, BUCKET, KEYS, root, manifest, part_size=5 * 1024 * 1024)
    return manifest


def fetcher(s3: RecordingS3, cache: Path, **kwargs: Any) -> ModelFetcher:
    return ModelFetcher(s3, BUCKET, KEYS, cache, AgentMetrics("r0", "qwen-7b"), lock_poll_s=0.01, **kwargs)


def sample(f: ModelFetcher, name: str, **labels: str) -> float:
    return f.metrics.registry.get_sample_value(name, labels) or 0.0


# ---- manifest and key layout -------------------------------------------------------------------------------


def manifest_json(files: str, extra: str = "") -> bytes:
    return f'{{"format": 1, "model": "m", "revision": "main", "files": [{files}]{extra}}}'.encode()


@pytest.mark.parametrize(
    ("name", "files", "problem"),
    [
        ("parent directory", f'{{"path": "../x", "size": 1, "sha256": "{SHA}"}}', "files.0.path"),
        ("absolute path", f'{{"path": "/etc/passwd", "size": 1, "sha256": "{SHA}"}}', "files.0.path"),
        ("dotfile", f'{{"path": "a/.cache/x", "size": 1, "sha256": "{SHA}"}}', "files.0.path"),
        ("partial suffix", f'{{"path": "x.partial", "size": 1, "sha256": "{SHA}"}}', "files.0.path"),
        ("short digest", '{"path": "x", "size": 1, "sha256": "abc"}', "files.0.sha256"),
        ("negative size", f'{{"path": "x", "size": -1, "sha256": "{SHA}"}}', "files.0.size"),
        ("no files", "", "files"),
    ],
)
def test_malformed_manifest_is_rejected_naming_source_and_field(name: str, files: str, problem: str) -> None:
    del name  # Unused: the test id.
    with pytest.raises(ManifestError, match=rf"^s3://b/k: invalid manifest at {problem}"):
        Manifest.parse(manifest_json(files), "s3://b/k")


def test_duplicate_paths_are_rejected() -> None:
    entry = f'{{"path": "x", "size": 1, "sha256": "{SHA}"}}'
    with pytest.raises(ManifestError, match="files listed twice: x"):
        Manifest.parse(manifest_json(f"{entry}, {entry}"), "m.json")


def test_manifest_round_trips_through_json() -> None:
    manifest = Manifest.parse(manifest_json(f'{{"path": "a/b.bin", "size": 7, "sha256": "{SHA}"}}'), "x")
    assert Manifest.parse(manifest.to_json(), "y") == manifest
    assert manifest.total_bytes == 7


def test_key_layout_puts_files_under_the_revision_and_the_manifest_beside_them() -> None:
    assert KEYS.manifest == "models/Qwen/Qwen2.5-7B-Instruct/main/manifest.json"
    assert KEYS.file("tokenizer/vocab.txt") == "models/Qwen/Qwen2.5-7B-Instruct/main/files/tokenizer/vocab.txt"


@pytest.mark.parametrize(
    ("prefix", "model", "revision"),
    [("models", "../etc", "main"), ("/x", "m", "main"), ("models", "m", "a/b"), ("models", "/abs/path", "main")],
)
def test_ids_that_cannot_be_keys_are_refused(prefix: str, model: str, revision: str) -> None:
    with pytest.raises(ValueError, match="must be"):
        ModelKeys(prefix, model, revision)


def test_scan_skips_dotfolders_and_hashes_every_file(tmp_path: Path) -> None:
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "lock").write_bytes(b"tool state")
    (tmp_path / "config.json").write_bytes(b"{}")
    manifest = scan_directory(tmp_path, "m", "main")
    assert [(f.path, f.size, f.sha256) for f in manifest.files] == [
        ("config.json", 2, hashlib.sha256(b"{}").hexdigest())
    ]


# ---- fetching ------------------------------------------------------------------------------------------------


def test_fetch_downloads_verifies_and_marks_the_model_read_only(s3: RecordingS3, tmp_path: Path) -> None:
    push_model(s3, tmp_path / "src")
    f = fetcher(s3, tmp_path / "cache")
    result = f.fetch()
    assert result == FetchResult(tmp_path / "cache" / KEYS.model / "main", "downloaded", TOTAL)
    for path, data in FILES.items():
        local = f.model_dir / path
        assert local.read_bytes() == data
        assert stat.S_IMODE(local.stat().st_mode) == 0o444
    assert stat.S_IMODE(f.model_dir.stat().st_mode) == 0o555
    assert stat.S_IMODE((f.model_dir / "tokenizer").stat().st_mode) == 0o555
    assert sample(f, "llmfleet_agent_model_fetched_bytes_total") == TOTAL
    assert sample(f, "llmfleet_agent_model_files_verified_total") == len(FILES)
    assert sample(f, "llmfleet_agent_model_fetches_total", result="downloaded") == 1
    assert not list(f.model_dir.rglob("*.partial"))


def test_a_complete_model_is_not_downloaded_again(s3: RecordingS3, tmp_path: Path) -> None:
    push_model(s3, tmp_path / "src")
    fetcher(s3, tmp_path / "cache").fetch()
    s3.gets.clear()
    again = fetcher(s3, tmp_path / "cache")
    assert again.fetch().source == "cached"
    assert s3.file_gets() == []
    assert sample(again, "llmfleet_agent_model_fetched_bytes_total") == 0


def test_an_interrupted_download_resumes_from_its_partial_file(s3: RecordingS3, tmp_path: Path) -> None:
    push_model(s3, tmp_path / "src")
    f = fetcher(s3, tmp_path / "cache")
    shard = "model-00001-of-00001.safetensors"
    f.model_dir.mkdir(parents=True)
    (f.model_dir / f"{shard}.partial").write_bytes(FILES[shard][:300_000])
    assert f.fetch().source == "downloaded"
    assert {"Key": KEYS.file(shard), "Bucket": BUCKET, "Range": "bytes=300000-"} in s3.file_gets()
    assert sample(f, "llmfleet_agent_model_fetched_bytes_total") == TOTAL - 300_000
    assert (f.model_dir / shard).read_bytes() == FILES[shard]


def test_a_partial_file_that_is_not_a_prefix_is_downloaded_again_from_zero(s3: RecordingS3, tmp_path: Path) -> None:
    push_model(s3, tmp_path / "src")
    f = fetcher(s3, tmp_path / "cache")
    f.model_dir.mkdir(parents=True)
    (f.model_dir / "config.json.partial").write_bytes(b"{garbage")
    f.fetch()
    assert (f.model_dir / "config.json").read_bytes() == FILES["config.json"]
    assert sample(f, "llmfleet_agent_model_checksum_failures_total") == 1


def test_a_corrupt_object_fails_after_one_retry_naming_the_file(s3: RecordingS3, tmp_path: Path) -> None:
    push_model(s3, tmp_path / "src")
    s3.client.put_object(Bucket=BUCKET, Key=KEYS.file("tokenizer/vocab.txt"), Body=b"hello\nworld?\n")
    f = fetcher(s3, tmp_path / "cache")
    with pytest.raises(ChecksumError, match=r"^tokenizer/vocab.txt: sha256 does not match .* two downloads"):
        f.fetch()
    assert len([g for g in s3.file_gets() if g["Key"].endswith("vocab.txt")]) == 2
    assert sample(f, "llmfleet_agent_model_checksum_failures_total") == 2
    assert sample(f, "llmfleet_agent_model_fetches_total", result="failed") == 1
    assert not (f.model_dir / "tokenizer" / "vocab.txt").exists()
    assert not f.model_dir.with_name("main.manifest.json").exists()


def test_a_model_missing_from_the_store_fails_unless_the_hub_fallback_is_on(s3: RecordingS3, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"not in the model store .*llmfleet model push.*hubFallback"):
        fetcher(s3, tmp_path / "cache").fetch()
    fallback = fetcher(s3, tmp_path / "cache", hub_fallback=True)
    assert fallback.fetch() == FetchResult(None, "hub", 0)
    assert sample(fallback, "llmfleet_agent_model_fetches_total", result="hub") == 1


def test_a_re_pushed_revision_fetches_only_the_changed_files_and_drops_stale_ones(
    s3: RecordingS3, tmp_path: Path
) -> None:
    push_model(s3, tmp_path / "src")
    fetcher(s3, tmp_path / "cache").fetch()
    (tmp_path / "src" / "empty.txt").unlink()
    changed = {**FILES, "config.json": b'{"architectures": []}'}
    del changed["empty.txt"]
    push_model(s3, tmp_path / "src", changed)
    s3.gets.clear()
    f = fetcher(s3, tmp_path / "cache")
    assert f.fetch().source == "downloaded"
    assert [g["Key"] for g in s3.file_gets()] == [KEYS.file("config.json")]
    assert sorted(p.name for p in f.model_dir.rglob("*") if p.is_file()) == sorted(Path(p).name for p in changed)


def test_an_unreachable_store_falls_back_to_the_verified_local_copy(s3: RecordingS3, tmp_path: Path) -> None:
    push_model(s3, tmp_path / "src")
    fetcher(s3, tmp_path / "cache").fetch()
    s3.client.delete_object(Bucket=BUCKET, Key=KEYS.manifest)
    assert fetcher(s3, tmp_path / "cache").fetch().source == "cached"


# ---- two agents, one cache ----------------------------------------------------------------------------------


def test_the_second_fetcher_waits_for_the_lock_then_downloads_nothing(s3: RecordingS3, tmp_path: Path) -> None:
    push_model(s3, tmp_path / "src")
    first = fetcher(s3, tmp_path / "cache")
    first.fetch()
    second = fetcher(s3, tmp_path / "cache")
    results: list[FetchResult] = []
    with (first.model_dir.with_name("main.lock")).open("a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as another agent mid-fetch would
        thread = threading.Thread(target=lambda: results.append(second.fetch()))
        thread.start()
        wait_for(lambda: second.phase == "waiting_for_lock", timeout_s=10, what="the second fetcher to wait")
        assert results == []
        fcntl.flock(lock, fcntl.LOCK_UN)
    thread.join(timeout=10)
    assert results == [FetchResult(second.model_dir, "cached", 0)]


def test_two_fetchers_at_once_download_the_model_exactly_once(s3: RecordingS3, tmp_path: Path) -> None:
    push_model(s3, tmp_path / "src")
    fetchers = [fetcher(s3, tmp_path / "cache") for _ in range(2)]
    results: list[FetchResult] = []
    threads = [threading.Thread(target=lambda f=f: results.append(f.fetch())) for f in fetchers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(r.source for r in results) == ["cached", "downloaded"]
    assert sum(f.bytes_fetched for f in fetchers) == TOTAL


def test_cancel_stops_a_fetcher_waiting_for_the_lock(s3: RecordingS3, tmp_path: Path) -> None:
    push_model(s3, tmp_path / "src")
    f = fetcher(s3, tmp_path / "cache")
    f.model_dir.parent.mkdir(parents=True)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            f.fetch()
        except BaseException as exc:  # the test inspects it
            errors.append(exc)

    with (f.model_dir.with_name("main.lock")).open("a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        thread = threading.Thread(target=run)
        thread.start()
        wait_for(lambda: f.phase == "waiting_for_lock", timeout_s=10, what="the fetcher to wait")
        f.cancel()
        thread.join(timeout=10)
    assert [type(e) for e in errors] == [FetchCancelled]
