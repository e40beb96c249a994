"""Dashboard render: a real Prometheus scrapes the fleet's own exporters on loopback; every prod dashboard is drawn
from it as a PNG of the expected size, with data in its panels."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from matplotlib.image import imread

from agent.metrics import AgentMetrics
from engine_sim.metrics import EngineMetricsRecorder
from fleet.spec.stack import FleetSpec
from gateway.metrics import GatewayMetrics
from infra.dashboard_render import RenderError, image_size, render, run_starts
from infra.dashboards import build_dashboards
from tests.support.prometheus import query, running_prometheus
from tests.support.wait import wait_for

MODEL, POOL, TENANT = "qwen2.5-7b-instruct", "qwen-7b", "acme"


class FleetExporters:
    """The gateway's, an engine's and an agent's real registries, plus the control plane's two gauges the
    dashboards read; every scrape advances them a little, so rates and quantiles have something to show."""

    def __init__(self) -> None:
        self.gateway = GatewayMetrics()
        self.engine = EngineMetricsRecorder(MODEL, 8192, {"block_size": "16"})
        self.agent = AgentMetrics("r0", POOL)
        self.scrapes = 0
        self.lock = threading.Lock()

    def advance(self) -> None:
        g, e, n = self.gateway, self.engine, self.scrapes
        for status, count in (("200", 20), ("500", 1 if n % 3 == 0 else 0), ("429", 2)):
            g.requests.labels(TENANT, MODEL, status).inc(count)
        g.tokens.labels(TENANT, MODEL, "in").inc(4000)
        g.tokens.labels(TENANT, MODEL, "out").inc(1600)
        g.ttft.labels(TENANT, MODEL).observe(0.08 + 0.01 * (n % 5))
        g.queue_wait.labels(MODEL, "8").observe(0.01)
        g.queue_wait.labels(MODEL, "2").observe(0.2)
        g.ready.labels(POOL).set(3)
        labels = (MODEL, "0")
        e.running.labels(*labels).set(12 + n % 4)
        e.waiting.labels(*labels).set(n % 3)
        e.kv_usage.labels(*labels).set(0.5 + 0.05 * (n % 6))
        e.prefix_queries.labels(*labels).inc(1000)
        e.prefix_hits.labels(*labels).inc(400)
        e.preemptions.labels(*labels).inc(n % 2)
        for _ in range(5):
            e.ttft.labels(*labels).observe(0.05 + 0.02 * (n % 4))
            e.itl.labels(*labels).observe(0.02)
        self.agent.restarts.labels("crash").inc(1 if n == 2 else 0)

    def exposition(self) -> bytes:
        with self.lock:
            self.advance()
            self.scrapes += 1
            target = 3 + (self.scrapes // 5) % 2  # a scaling decision every fifth scrape
            control = (
                f'llmfleet_pool_replicas{{pool="{POOL}",state="ready"}} 3\n'
                f'llmfleet_pool_replicas{{pool="{POOL}",state="starting"}} {target - 3}\n'
                f'llmfleet_autoscaler_target_replicas{{pool="{POOL}"}} {target}\n'
            )
            return b"".join([self.gateway.render(), self.engine.exposition(), self.agent.render(), control.encode()])


@pytest.fixture
def exporters() -> Iterator[str]:
    """``host:port`` of a loopback server whose ``/metrics`` is `FleetExporters`' exposition."""
    fleet = FleetExporters()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = fleet.exposition()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            del args  # Unused: scrapes every second would flood the test's output.

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def prometheus(exporters: str, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus scraping ``exporters`` every second, with the pool label the engine PodMonitor adds."""
    with running_prometheus(tmp_path, exporters, {"llmfleet_io_pool": POOL}) as url:
        yield url


def _scraped(url: str, times: int) -> bool:
    """True once Prometheus holds ``times`` scrapes of the fleet: several points of the range then have two
    samples in their rate window, whatever instant the range's last step falls on."""
    return bool(query(url, f'count_over_time(llmfleet_gateway_requests_total{{status="200"}}[1m]) >= {times}'))


def test_every_prod_dashboard_renders_with_data_from_a_real_prometheus(
    prometheus: str, prod_spec: FleetSpec, tmp_path: Path
) -> None:
    start = time.time()
    wait_for(lambda: _scraped(prometheus, 8), timeout_s=30, interval_s=0.5, what="eight scrapes in Prometheus")
    end = time.time()
    for name, model in build_dashboards(prod_spec).items():
        # Scrapes run every second; saying two gives 8 s rate windows, which still hold two samples when a busy
        # machine delays a scrape or two.
        drawn = render(model, prometheus, start, end, tmp_path / f"{name}.png", scrape_interval_s=2.0)
        assert drawn.empty == [], f"{name}: panels without data: {drawn.empty}"
        pixels = imread(drawn.path)
        width, height = image_size(model)
        assert pixels.shape[:2] == (height, width)
        ink = (pixels[:, :, :3].mean(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
        assert ink > 0.02, f"{name}: the image is almost blank ({ink:.1%} drawn)"


def test_a_query_prometheus_refuses_names_the_panel(prometheus: str, tmp_path: Path) -> None:
    broken = {
        "title": "broken",
        "panels": [{"type": "timeseries", "title": "Unbalanced", "targets": [{"expr": "sum(rate(x[1m])"}]}],
    }
    now = time.time()
    with pytest.raises(RenderError, match="Unbalanced"):
        render(broken, prometheus, now - 60, now, tmp_path / "broken.png")


def test_an_annotation_is_drawn_once_per_run_of_samples() -> None:
    # Sample times in days, as matplotlib takes them: one step apart they differ by a step only up to rounding.
    step, first = 2.0, 1_796_111_299.0
    times = [(first + step * i) / 86400 for i in [*range(30), *range(40, 45)]]
    assert run_starts(times, step) == [times[0], times[30]]
