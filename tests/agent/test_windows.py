"""Restart windows: open/closed at a given instant, across midnight and time zones, gated by uptime."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent.windows import occurrences, open_window, restart_due
from fleet.spec.stack import RestartWindowSpec


def window(**kw: object) -> RestartWindowSpec:
    return RestartWindowSpec.model_validate({"enabled": True, "start": "03:00", "durationMinutes": 120, **kw})


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("name", "spec", "now", "start"),
    [
        ("before", window(), "2026-03-10T02:59:59", None),
        ("at start", window(), "2026-03-10T03:00:00", "2026-03-10T03:00:00"),
        ("inside", window(), "2026-03-10T04:30:00", "2026-03-10T03:00:00"),
        ("end is exclusive", window(), "2026-03-10T05:00:00", None),
        ("crosses midnight, before it", window(start="23:00"), "2026-03-10T23:30:00", "2026-03-10T23:00:00"),
        ("crosses midnight, after it", window(start="23:00"), "2026-03-11T00:30:00", "2026-03-10T23:00:00"),
        ("crosses midnight, closed", window(start="23:00"), "2026-03-11T01:00:00", None),
        ("berlin winter (UTC+1)", window(timezone="Europe/Berlin"), "2026-01-15T02:30:00", "2026-01-15T02:00:00"),
        ("berlin summer (UTC+2)", window(timezone="Europe/Berlin"), "2026-07-15T01:00:00", "2026-07-15T01:00:00"),
        ("new york, closed in UTC terms", window(timezone="America/New_York"), "2026-07-15T03:30:00", None),
    ],
)
def test_open_window(name: str, spec: RestartWindowSpec, now: str, start: str | None) -> None:
    del name  # Unused: the id.
    found = open_window(spec, utc(now))
    assert found == (utc(start) if start else None)


@pytest.mark.parametrize(
    ("spec", "uptime_h", "due"),
    [
        (window(minUptimeHours=48), 47.9, False),
        (window(minUptimeHours=48), 48.0, True),
        (window(minUptimeHours=0), 0.0, True),
        (window(enabled=False, minUptimeHours=0), 100.0, False),
    ],
)
def test_restart_due_needs_enabled_window_and_min_uptime(spec: RestartWindowSpec, uptime_h: float, due: bool) -> None:
    now = utc("2026-03-10T03:30:00")
    assert (restart_due(spec, now, uptime_h * 3600) is not None) is due


def test_naive_datetime_is_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        open_window(window(), datetime(2026, 3, 10, 3, 30))


def test_occurrences_list_every_window_overlapping_a_span() -> None:
    spans = occurrences(window(start="23:00"), utc("2026-03-10T00:30:00"), utc("2026-03-11T23:30:00"))
    assert [(a.isoformat(), b.isoformat()) for a, b in spans] == [
        ("2026-03-09T23:00:00+00:00", "2026-03-10T01:00:00+00:00"),  # began the day before, still open
        ("2026-03-10T23:00:00+00:00", "2026-03-11T01:00:00+00:00"),
        ("2026-03-11T23:00:00+00:00", "2026-03-12T01:00:00+00:00"),
    ]


def test_occurrences_follow_the_zone_across_a_dst_change() -> None:
    # Berlin moves from UTC+1 to UTC+2 on 2026-03-29: 03:00 local is 02:00 UTC before, 01:00 UTC after.
    spans = occurrences(window(timezone="Europe/Berlin"), utc("2026-03-28T00:00:00"), utc("2026-03-29T23:00:00"))
    assert [a.isoformat() for a, _ in spans] == ["2026-03-28T02:00:00+00:00", "2026-03-29T01:00:00+00:00"]
