"""``llmfleet model push``: upload a model directory to the stack's model store, manifest last.

    llmfleet model push --stack NAME|--bucket B [--prefix P] MODEL_DIR --model MODEL_ID [--revision R]

The order is what keeps readers safe (`fleet.protocol.model_manifest`): hash every file, delete the revision's old
manifest,
upload each file (multipart through boto3's transfer manager above ``--part-size``), then write the new manifest.
An object that already holds the same bytes (its ``sha256`` metadata matches) is not sent again, so an
interrupted push resumes where it stopped. Do not change the directory while it is being pushed.

The bucket is ``--bucket``, else the stack's output ``modelBucket`` (read with ``pulumi stack output``). The
prefix is ``--prefix``, else the stack's ``modelStore.prefix``, else ``models``. The S3 endpoint and credentials
follow boto3's own settings (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ...).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from fleet.protocol.model_manifest import Manifest, ManifestError, ModelKeys, scan_directory
from fleet.spec.errors import SpecError
from fleet.spec.loader import load_spec
from llmfleet.registries import all_registries

__all__ = ["add_arguments", "push", "run"]

MIB = 1024 * 1024
SHA256_METADATA = "sha256"  # object metadata key (x-amz-meta-sha256) holding the file's digest


class PushError(RuntimeError):
    """The push cannot start (no bucket, bad arguments); the message says what to pass instead."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", required=True, metavar="push")
    p = sub.add_parser("push", help="upload a model directory to the model store (manifest written last)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--stack", help="stack name or file: its modelBucket output and modelStore.prefix")
    where.add_argument("--bucket", help="the model bucket (instead of a stack's)")
    p.add_argument("--prefix", help="key prefix (default: the stack's modelStore.prefix, else 'models')")
    p.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="the model's files (a Hub snapshot folder)")
    p.add_argument("--model", required=True, help="model id as pools name it, e.g. Qwen/Qwen2.5-7B-Instruct")
    p.add_argument("--revision", default="main", help="revision label, as the pool's modelRevision (default main)")
    p.add_argument("--part-size", type=int, default=64, metavar="MIB", help="multipart part size, >= 5 (default 64)")


def run(args: argparse.Namespace) -> int:
    try:
        bucket, prefix, region = _target(args)
        if args.part_size < 5:
            raise PushError("--part-size must be at least 5 (MiB): S3's smallest multipart part")
        if not args.model_dir.is_dir():
            raise PushError(f"{args.model_dir} is not a directory")
        keys = ModelKeys(prefix, args.model, args.revision)
        manifest = scan_directory(args.model_dir, args.model, args.revision)
    except (PushError, ManifestError, ValueError, SpecError) as exc:
        print(f"llmfleet model push: {exc}", file=sys.stderr)
        return 2
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client("s3", region_name=region)
    try:
        push(client, bucket, keys, args.model_dir, manifest, part_size=args.part_size * MIB)
    except (BotoCoreError, ClientError, OSError) as exc:
        print(f"llmfleet model push: s3://{bucket}/{keys.root}: {exc}", file=sys.stderr)
        return 1
    print(f"pushed {keys.model} revision {keys.revision}: {len(manifest.files)} files, {manifest.total_bytes} bytes")
    print(f"manifest: s3://{bucket}/{keys.manifest}")
    return 0


def push(client: Any, bucket: str, keys: ModelKeys, root: Path, manifest: Manifest, *, part_size: int) -> list[str]:
    """Upload ``manifest``'s files from ``root`` and then the manifest; returns the paths actually sent."""
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError

    config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size)
    # Readers treat the manifest as "complete": it must be gone before any object of the revision changes.
    client.delete_object(Bucket=bucket, Key=keys.manifest)
    sent = []
    for entry in manifest.files:
        key = keys.file(entry.path)
        try:
            head = client.head_object(Bucket=bucket, Key=key)
            if head["ContentLength"] == entry.size and head["Metadata"].get(SHA256_METADATA) == entry.sha256:
                print(f"  {entry.path}: already in the store", flush=True)
                continue
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        extra = {"Metadata": {SHA256_METADATA: entry.sha256}}
        client.upload_file(str(root / entry.path), bucket, key, ExtraArgs=extra, Config=config)
        sent.append(entry.path)
        print(f"  {entry.path}: {entry.size} bytes", flush=True)
    client.put_object(Bucket=bucket, Key=keys.manifest, Body=manifest.to_json(), ContentType="application/json")
    return sent


def _target(args: argparse.Namespace) -> tuple[str, str, str | None]:
    """(bucket, prefix, region) from the flags and, with ``--stack``, the stack file and its outputs."""
    if args.stack is None:
        return args.bucket, args.prefix or "models", None
    loaded = load_spec(args.stack, registries=all_registries())
    spec = loaded.spec
    if args.model not in {pool.model for pool in spec.pools}:
        print(f"warning: no pool of stack {loaded.name} serves {args.model}", file=sys.stderr)
    if spec.target != "aws":
        raise PushError(f"stack {loaded.name} (target {spec.target}) has no model bucket; pass --bucket")
    return _stack_bucket(loaded.name, Path(loaded.file)), args.prefix or spec.model_store.prefix, spec.region


def _stack_bucket(stack: str, stack_file: Path) -> str:
    """The stack's ``modelBucket`` output, run from the project folder (the stack file's folder's parent)."""
    argv = ["pulumi", "stack", "output", "modelBucket", "--stack", stack]
    try:
        done = subprocess.run(argv, cwd=stack_file.resolve().parent.parent, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise PushError("reading the stack output modelBucket needs the pulumi CLI; or pass --bucket") from None
    if done.returncode != 0 or not done.stdout.strip():
        detail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise PushError(f"`{' '.join(argv)}` failed ({detail[0]}); deploy the stack first, or pass --bucket")
    return done.stdout.strip()
