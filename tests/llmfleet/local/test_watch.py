"""``llmfleet up``'s Prometheus start: off when told or when there is no binary, off with the reason when it does
not start; the fleet goes on in every case."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from llmfleet.local.watch import start_prometheus

GATEWAY, CONTROL_PLANE = "http://127.0.0.1:1", "http://127.0.0.1:2"


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"no_prometheus": False, "prometheus_port": None, **kw})


def test_no_prometheus_skips_it(tmp_path: Path) -> None:
    assert start_prometheus(_args(no_prometheus=True), tmp_path, CONTROL_PLANE, GATEWAY, None) == (
        None,
        "off (--no-prometheus)",
    )


def test_a_missing_binary_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert start_prometheus(_args(), tmp_path, CONTROL_PLANE, GATEWAY, None) == (
        None,
        "off: no `prometheus` on PATH",
    )


def test_a_prometheus_that_exits_at_once_is_off_with_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "bin" / "prometheus"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\necho 'bad flag' >&2\nexit 1\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ['PATH']}")
    prometheus, about = start_prometheus(_args(), tmp_path, CONTROL_PLANE, GATEWAY, "groups: []\n")
    assert prometheus is None
    assert about == f"off: it did not start, see {tmp_path / 'prometheus.log'}"
    assert "bad flag" in (tmp_path / "prometheus.log").read_text()
    assert (tmp_path / "prometheus" / "rules.yml").read_text() == "groups: []\n"
