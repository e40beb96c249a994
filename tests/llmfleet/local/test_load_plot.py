"""``llmfleet load --plot``: the run recorded second by second against a real local fleet, and drawn as a PNG.

The fleet is `faulty_fleet`: its engine fails half the requests, so the error series has something to show.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.protocol.control_auth import ClientCredential, Kind
from fleet.protocol.keys import DEMO_API_KEY
from llmfleet.local.load import LoadStats, poll_ready, run_load
from llmfleet.local.timeseries import Recorder
from tests.llmfleet.local.conftest import Fleet

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-7b-instruct"


async def test_the_recorded_series_counts_every_request_once(faulty_fleet: Fleet) -> None:
    stats = LoadStats(recorder=Recorder())
    stop = asyncio.Event()
    credential = ClientCredential(Kind.CONTROL_PLANE, secret=faulty_fleet.secret)
    poller = asyncio.create_task(poll_ready(faulty_fleet.control_plane, stats, stop, 0.5, credential))
    try:
        await run_load(
            faulty_fleet.gateway, DEMO_API_KEY, MODEL, 8, 3.0, prompt_tokens=32, output_tokens=16, stats=stats
        )
    finally:
        stop.set()
        await poller
    assert stats.recorder is not None
    timeline = stats.recorder.timeline(1.0, end_s=stats.since_start())
    assert timeline.sent == stats.sent > 10
    assert timeline.completed == stats.ok and timeline.errors == dict(stats.errors)
    assert stats.ok > 0 and stats.errors  # half fail: both series are drawn
    assert len(timeline.intervals) >= 3
    assert any(s.pool == "qwen-7b" and s.ready >= 1 for s in timeline.ready)


def test_load_plot_writes_a_png_with_the_run(faulty_fleet: Fleet, tmp_path: Path) -> None:
    import matplotlib.image

    png = tmp_path / "load.png"
    argv = ["load", "--rps", "6", "--duration", "3", "--gateway", faulty_fleet.gateway]
    argv += ["--control-plane", faulty_fleet.control_plane, "--plot", str(png)]
    cli = [sys.executable, "-m", "llmfleet.cli", *argv]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=90, env=faulty_fleet.env)
    assert done.returncode == 1, done.stderr  # some requests failed, as the engine was told to
    assert f"plot: {png}" in done.stderr
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[:2] == (990, 810)  # 9 x 11 inches at 90 dpi
    assert float(pixels[..., :3].var()) > 0.005
