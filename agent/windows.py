"""Windows: when a replica may take its planned restart (pure functions of the spec and ``now``).

A pool's restart window opens daily at ``start`` in its IANA ``timezone`` and lasts ``durationMinutes``
(it may cross midnight, and the wall-clock length follows DST shifts of that zone). A replica is due when the
window is open, restarts are enabled and its engine has been up at least ``minUptimeHours``. Each window
occurrence is identified by its start instant, so a replica restarts (or skips) at most once per occurrence.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from fleet.spec.stack import RestartWindowSpec

__all__ = ["occurrences", "open_window", "restart_due"]


def open_window(spec: RestartWindowSpec, now: datetime) -> datetime | None:
    """Start (UTC) of the window occurrence open at ``now`` (timezone-aware), or None when closed."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    # The occurrence that started today or, for a window crossing midnight, yesterday.
    for start, end in occurrences(spec, now - timedelta(days=1), now):
        if start <= now < end:
            return start
    return None


def occurrences(spec: RestartWindowSpec, since: datetime, until: datetime) -> list[tuple[datetime, datetime]]:
    """Every window occurrence, ``(start, end)`` in UTC and oldest first, that overlaps ``[since, until]``
    (timezone-aware), whether or not restarts are enabled."""
    if since.tzinfo is None or until.tzinfo is None:
        raise ValueError("since and until must be timezone-aware")
    zone = ZoneInfo(spec.timezone)
    day = since.astimezone(zone).date() - timedelta(days=1)  # a window crossing midnight started the day before
    last = until.astimezone(zone).date()
    out = []
    while day <= last:
        start = datetime.combine(day, spec.start, tzinfo=zone).astimezone(UTC)
        end = start + timedelta(minutes=spec.duration_minutes)
        if start <= until and end > since:
            out.append((start, end))
        day += timedelta(days=1)
    return out


def restart_due(spec: RestartWindowSpec, now: datetime, uptime_s: float) -> datetime | None:
    """The open occurrence in which this replica is due for a planned restart, else None."""
    if not spec.enabled or uptime_s < spec.min_uptime_hours * 3600.0:
        return None
    return open_window(spec, now)
