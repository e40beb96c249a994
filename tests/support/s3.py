"""S3 for tests: moto's in-process AWS with credentials that cannot reach a real account."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from moto import mock_aws

__all__ = ["moto_s3"]


@contextmanager
def moto_s3(monkeypatch: pytest.MonkeyPatch, bucket: str) -> Iterator[Any]:
    """An S3 client on moto with ``bucket`` created; any endpoint or profile from the environment is cleared."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        yield client
