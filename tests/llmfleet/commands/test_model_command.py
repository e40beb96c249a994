"""``llmfleet model push``: the order of writes, multipart uploads, resuming, and refusals (moto's in-process S3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.protocol.model_manifest import Manifest, ModelKeys, scan_directory
from llmfleet.cli import main
from llmfleet.commands.model import MIB, push
from tests.support.s3 import moto_s3

BUCKET = "models-test"
KEYS = ModelKeys("models", "Qwen/Qwen2.5-7B-Instruct", "main")


class CallLog:
    """A boto3 S3 client that records the name and key of every call."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            key = kwargs.get("Key") or (args[2] if name == "upload_file" else "")
            self.calls.append((name, key))
            return method(*args, **kwargs)

        return call


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with moto_s3(monkeypatch, BUCKET) as client:
        yield client


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, Manifest]:
    root = tmp_path / "model"
    (root / ".cache").mkdir(parents=True)
    (root / ".cache" / "download.lock").write_bytes(b"")
    (root / "config.json").write_bytes(b"{}")
    (root / "model.safetensors").write_bytes(b"\x01" * (11 * MIB))
    return root, scan_directory(root, KEYS.model, KEYS.revision)


def test_push_drops_the_old_manifest_first_and_writes_the_new_one_last(s3: Any, model: tuple[Path, Manifest]) -> None:
    root, manifest = model
    log = CallLog(s3)
    push(log, BUCKET, KEYS, root, manifest, part_size=5 * MIB)
    writes = [(name, key) for name, key in log.calls if name in ("delete_object", "upload_file", "put_object")]
    assert writes[0] == ("delete_object", KEYS.manifest)
    assert writes[-1] == ("put_object", KEYS.manifest)
    assert sorted(key for name, key in writes if name == "upload_file") == [
        KEYS.file("config.json"),
        KEYS.file("model.safetensors"),
    ]
    stored = Manifest.parse(s3.get_object(Bucket=BUCKET, Key=KEYS.manifest)["Body"].read(), KEYS.manifest)
    assert stored == manifest and [f.path for f in stored.files] == ["config.json", "model.safetensors"]


def test_files_above_the_part_size_go_up_in_parts(s3: Any, model: tuple[Path, Manifest]) -> None:
    root, manifest = model
    push(s3, BUCKET, KEYS, root, manifest, part_size=5 * MIB)
    head = s3.head_object(Bucket=BUCKET, Key=KEYS.file("model.safetensors"))
    assert head["ETag"].strip('"').endswith("-3")  # 11 MiB in 5 MiB parts
    assert head["Metadata"]["sha256"] == manifest.files[1].sha256


def test_an_interrupted_push_sends_only_what_is_missing(s3: Any, model: tuple[Path, Manifest]) -> None:
    root, manifest = model
    push(s3, BUCKET, KEYS, root, manifest, part_size=5 * MIB)
    s3.delete_object(Bucket=BUCKET, Key=KEYS.file("config.json"))
    assert push(s3, BUCKET, KEYS, root, manifest, part_size=5 * MIB) == ["config.json"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--stack", "local"], "stack local (target local) has no model bucket; pass --bucket"),
        (["--bucket", BUCKET, "--part-size", "4"], "--part-size must be at least 5"),
        (["--bucket", BUCKET, "--revision", "a/b"], "revision 'a/b' must be"),
    ],
)
def test_push_refuses_arguments_it_cannot_honour(
    flags: list[str], message: str, model: tuple[Path, Manifest], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = model
    assert main(["model", "push", *flags, str(root), "--model", KEYS.model]) == 2
    assert message in capsys.readouterr().err
