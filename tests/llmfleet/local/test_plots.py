"""Plots: a timeline drawn as a PNG with one panel per series, read back as pixels."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.local.plots import write_timeline_png
from llmfleet.local.timeseries import Recorder, Timeline


def _pixels(path: Path):  # type: ignore[no-untyped-def]
    import matplotlib.image

    return matplotlib.image.imread(path)


def _busy() -> Timeline:
    r = Recorder()
    for n in range(200):
        at = n * 0.05
        r.on_sent(at)
        if n % 10 == 0:
            r.on_error(at + 0.01, "503")
        else:
            r.on_ok(at + 0.2 + (n % 7) * 0.02, latency_s=0.2 + (n % 7) * 0.02, ttft_s=0.05 + (n % 5) * 0.01)
    r.on_ready(0.0, {"qwen-7b": 1})
    r.on_ready(4.0, {"qwen-7b": 2})
    return r.timeline(1.0)


def test_the_png_has_the_figure_size_and_is_not_blank(tmp_path: Path) -> None:
    path = write_timeline_png(tmp_path / "sub" / "run.png", _busy(), "stack e2e, 20 req/s for 10 s", dpi=50)
    pixels = _pixels(path)
    assert pixels.shape[:2] == (11 * 50, 9 * 50)  # figsize (9, 11) inches at 50 dpi
    assert float(pixels[..., :3].var()) > 0.005  # lines, labels and text, not a white page
    assert not list(tmp_path.glob("sub/.*"))  # no partial file left beside it


@pytest.mark.parametrize("timeline", [Timeline(), Recorder().timeline(1.0)], ids=["no-intervals", "one-empty"])
def test_an_empty_run_still_draws_labelled_panels(tmp_path: Path, timeline: Timeline) -> None:
    path = write_timeline_png(tmp_path / "empty.png", timeline, "nothing sent", dpi=40)
    assert float(_pixels(path)[..., :3].var()) > 0.001
