"""Prometheus: a real ``prometheus`` process for tests, scraping loopback targets every second.

`running_prometheus` writes the config, starts the binary (its TSDB and log in a temp folder), waits until
``/-/ready`` answers (Prometheus answers 503 while it starts), yields its URL and kills it afterwards. Without
the binary the test is skipped, or fails where ``CI=true`` (CI installs Debian's ``prometheus``). `query`
returns a PromQL answer's result list, empty while Prometheus cannot answer yet.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleet.protocol.ports import free_port
from tests.support.wait import wait_for

__all__ = ["query", "running_prometheus"]


def _binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus is not installed (CI installs it)")
        pytest.skip("prometheus is not installed")
    return binary


@contextlib.contextmanager
def running_prometheus(folder: Path, target: str, labels: Mapping[str, str] | None = None) -> Iterator[str]:
    """Prometheus scraping ``target`` (``host:port``, with ``labels``) every second; yields its URL once ready."""
    binary = _binary()
    group: dict[str, Any] = {"targets": [target], **({"labels": dict(labels)} if labels else {})}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "test", "static_configs": [group]}],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    argv = [
        binary,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'tsdb'}",
        f"--web.listen-address={url.removeprefix('http://')}",
    ]
    with (folder / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:

            def ready() -> bool:
                if process.poll() is not None:
                    raise AssertionError(f"prometheus exited: {(folder / 'prometheus.log').read_text()[-2000:]}")
                return httpx.get(f"{url}/-/ready", timeout=2.0).status_code == 200

            wait_for(ready, timeout_s=30, interval_s=0.2, what="Prometheus to be ready", ignore=(httpx.HTTPError,))
            yield url
        finally:
            process.kill()
            process.wait(timeout=20)


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """The ``result`` of an instant query; empty while Prometheus answers anything but 200."""
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5.0)
    if response.status_code != 200:
        return []
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result
