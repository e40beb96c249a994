"""Live view: snapshots of the gateway's metrics and the control plane's pools, rendered as text; and the view in
the log of a running ``llmfleet up --live``."""

from __future__ import annotations

import io
from typing import Any

import pytest

from llmfleet.local.live import Screen, Snapshot, interval_between, render, snapshot
from tests.llmfleet.local.conftest import Fleet
from tests.support.wait import wait_for

BOUNDS = (0.1, 0.25, 0.5, 1.0, float("inf"))


def metrics(requests: dict[str, float], ttft: list[float], e2e: list[float]) -> str:
    """Gateway metrics text: ``requests`` by status (split over two tenants, as the gateway labels them) and
    cumulative TTFT and end-to-end bucket counts at `BOUNDS`."""
    lines = []
    for status, n in requests.items():
        for tenant in ("a", "b"):
            lines.append(f'llmfleet_gateway_requests_total{{model="m",status="{status}",tenant="{tenant}"}} {n / 2}')
    for name, counts in (("ttft", ttft), ("e2e", e2e)):
        for bound, count in zip(BOUNDS, counts, strict=True):
            le = "+Inf" if bound == float("inf") else str(bound)
            lines.append(f'llmfleet_gateway_{name}_seconds_bucket{{le="{le}",model="m",tenant="a"}} {count}')
    return "\n".join(lines) + "\n"


def pools(ready: int, decision: dict[str, Any] | None = None) -> dict[str, Any]:
    pool = {"pool": "qwen-7b", "model": "m", "min": 1, "max": 4, "replicas": 2, "ready": ready, "stale": 0}
    return {"pools": [{**pool, "last_decision": decision}]}


UP = {"at": 1_700_000_000.0, "kind": "scale-up", "current": 1, "target": 2, "reason": "queue needs 1.75 replicas"}
BEFORE = snapshot(10.0, metrics({"200": 100, "503": 4}, [0, 50, 90, 100, 100], [0, 0, 40, 90, 100]), pools(1))
AFTER = snapshot(
    12.0, metrics({"200": 120, "503": 8, "429": 2}, [0, 60, 108, 120, 120], [0, 0, 44, 110, 120]), pools(2, UP)
)


def test_an_interval_is_the_difference_of_two_snapshots() -> None:
    i = interval_between(BEFORE, AFTER)
    assert (i.start_s, i.length_s) == (10.0, 2.0)
    assert (i.sent, i.completed, dict(i.errors)) == (26, 20, {"429": 2, "503": 4})
    # 20 TTFTs in the interval: 10 in (0.1, 0.25], 8 in (0.25, 0.5], 2 in (0.5, 1]; linear within a bucket.
    assert i.ttft_p50_s == pytest.approx(0.25) and i.ttft_p99_s == pytest.approx(0.95)
    assert i.latency_p50_s == pytest.approx(0.6875)


def test_the_view_shows_rates_errors_latency_replicas_and_the_last_decision() -> None:
    view = render(BEFORE, AFTER, clock="12:00:02")
    assert view.splitlines()[0] == "llmfleet live  12:00:02"
    assert "13.0/s" in view and "ok 10.0/s" in view and "429 1.0/s" in view and "503 2.0/s" in view
    assert "p50 250 ms  p99 950 ms" in view and "latency  p50 688 ms" in view
    assert "pool qwen-7b   ready 2/2 (min 1, max 4)" in view
    assert "scale-up 1 -> 2: queue needs 1.75 replicas" in view


@pytest.mark.parametrize(
    ("before", "now", "shown", "hidden"),
    [
        (None, AFTER, "(measuring)", "/s"),
        (snapshot(10.0, None, pools(1)), AFTER, "(measuring)", "/s"),
        (BEFORE, snapshot(12.0, None, pools(1)), "gateway        unreachable", "/s"),
        (BEFORE, snapshot(12.0, metrics({"200": 100}, [0] * 5, [0] * 5), None), "control plane  unreachable", "ready"),
        (
            BEFORE,
            snapshot(12.0, metrics({"200": 100, "503": 4}, [0, 50, 90, 100, 100], [0] * 5), pools(1)),
            "none",
            "p50 1",
        ),
    ],
    ids=["first-snapshot", "gateway-back", "gateway-down", "control-plane-down", "idle"],
)
def test_what_is_unknown_is_said_never_shown_as_zero(
    before: Snapshot | None, now: Snapshot, shown: str, hidden: str
) -> None:
    view = render(before, now)
    assert shown in view and hidden not in view


def test_a_gateway_restart_counts_from_zero_not_as_negative_traffic() -> None:
    restarted = snapshot(12.0, metrics({"200": 6}, [0, 6, 6, 6, 6], [0, 0, 6, 6, 6]), pools(1))
    i = interval_between(BEFORE, restarted)
    assert (i.sent, i.completed) == (6, 6)


def test_a_terminal_screen_redraws_in_place_and_a_log_appends() -> None:
    tty, log = io.StringIO(), io.StringIO()
    for out, is_tty in ((tty, True), (log, False)):
        screen = Screen(out, is_tty)
        screen.show("a\nb")
        screen.show("c\nd")
    assert tty.getvalue() == "a\nb\n\x1b[2F\x1b[Jc\nd\n"
    assert log.getvalue() == "\na\nb\n\nc\nd\n"


@pytest.mark.slow
def test_up_live_refreshes_the_view_and_its_png(faulty_fleet: Fleet) -> None:
    import matplotlib.image

    def refreshed() -> str | None:
        log = faulty_fleet.up.text()
        views = log.split("llmfleet live")[1:]
        return log if len(views) >= 3 and "pool qwen-7b" in views[-1] else None

    wait_for(refreshed, timeout_s=30, what="three refreshes of the live view", diagnostics=faulty_fleet.logs)
    png = faulty_fleet.log_dir / "live.png"
    wait_for(png.exists, timeout_s=30, what=f"{png} written", diagnostics=faulty_fleet.logs)
    assert float(matplotlib.image.imread(png)[..., :3].var()) > 0.005
