"""Windows: when a replica may take its planned restart (pure functions of the spec and ``now``).

A pool's restart window opens daily at ``start`` in its IANA ``timezone`` and lasts ``durationMinutes``
(it may cross midnight, and the wall-clock length follows DST shifts of that zone). A replica is due when the
window is open, restarts are enabled and its engine has been up at least ``minUptimeHours``. Each window
occurrence is identified by its start instant, so a replica restarts (or skips) at most once per occurrence.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from fleet.spec import RestartWindowSpec

__all__ = ["open_window", "restart_due"]


def open_window(spec: RestartWindowSpec, now: datetime) -> datetime | None:
    """Start (UTC) of the window occurrence open at ``now`` (timezone-aware), or None when closed."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    zone = ZoneInfo(spec.timezone)
    local_today = now.astimezone(zone).date()
    # The occurrence that started today or, for a window crossing midnight, yesterday.
    for days_back in (0, 1):
        day = local_today - timedelta(days=days_back)
        start = datetime.combine(day, spec.start, tzinfo=zone).astimezone(UTC)
        if start <= now < start + timedelta(minutes=spec.duration_minutes):
            return start
    return None


def restart_due(spec: RestartWindowSpec, now: datetime, uptime_s: float) -> datetime | None:
    """The open occurrence in which this replica is due for a planned restart, else None."""
    if not spec.enabled or uptime_s < spec.min_uptime_hours * 3600.0:
        return None
    return open_window(spec, now)
