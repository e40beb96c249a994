"""Measured starts: each replica start counted once when ready, the pool's median and longest beside its
coldStartSeconds, and a log line when the median is longer than it."""

from __future__ import annotations

import logging

import pytest

from control_plane.starts import KEPT, StartLedger
from fleet.protocol.wire import LoadReport, StartPhases


def report(replica: str, started_at: float, ready_s: float | None, fetch_s: float | None = None) -> LoadReport:
    start = StartPhases(
        started_at=started_at, fetch_s=fetch_s, load_s=1.0, compile_s=None, graphs_s=None, ready_s=ready_s
    )
    return LoadReport(
        replica=replica,
        pool="qwen-7b",
        engine_url="http://10.0.0.5:8001",
        state="ready" if ready_s is not None else "starting",
        model="qwen",
        engine_version="sim",
        start=start,
        ts=started_at + 1,
    )


def test_a_start_counts_once_when_ready_with_its_fetch() -> None:
    ledger = StartLedger()
    assert not ledger.record(report("r1", 100.0, None), cold_start_s=150)  # still starting
    assert ledger.record(report("r1", 100.0, 90.0, fetch_s=30.0), cold_start_s=150)
    assert not ledger.record(report("r1", 100.0, 90.0, fetch_s=30.0), cold_start_s=150)  # the next report, same
    assert ledger.record(report("r1", 500.0, 60.0), cold_start_s=150)  # its engine restarted: a new start
    summary = ledger.summary("qwen-7b", 150)
    assert summary is not None
    assert (summary.count, summary.p50_s, summary.max_s) == (2, 60.0, 120.0)
    assert summary.last.started_at == 500.0 and ledger.summary("other", 150) is None


def test_only_the_last_starts_are_kept() -> None:
    ledger = StartLedger()
    for i in range(KEPT + 5):
        ledger.record(report(f"r{i}", float(i), 100.0 + i), cold_start_s=150)
    summary = ledger.summary("qwen-7b", 150)
    assert summary is not None and summary.count == KEPT and summary.max_s == 100.0 + KEPT + 4


@pytest.mark.parametrize(("ready_s", "logged"), [(170.0, False), (200.0, True)])
def test_a_median_start_past_cold_start_seconds_is_logged(
    ready_s: float, logged: bool, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = StartLedger()
    with caplog.at_level(logging.WARNING, logger="llmfleet.control_plane.starts"):
        ledger.record(report("r1", 1.0, ready_s), cold_start_s=150)
        ledger.record(report("r2", 2.0, ready_s), cold_start_s=150)
    lines = [r.getMessage() for r in caplog.records]
    assert bool(lines) == logged, lines
    if logged:  # once per median, not once per report
        assert len(lines) == 1 and "median start is 200 s over 1 starts, coldStartSeconds says 150 s" in lines[0]
