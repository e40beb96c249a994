"""``llmfleet slo``: budgets from a real Prometheus scraping a gateway's series, and from a control plane process;
``llmfleet status`` shows the spend per pool."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fleet.protocol.ports import free_port
from fleet.protocol.wire import PoolBudget, SloBudget
from gateway.metrics import GatewayMetrics
from llmfleet.cli import main
from llmfleet.commands.slo import format_budgets
from llmfleet.local.procs import Child
from tests.support import stacks
from tests.support.procs import Proc
from tests.support.prometheus import query, running_prometheus
from tests.support.wait import wait_for

MODEL = stacks.MODEL


class ServedGateway:
    """A gateway's admin /metrics on loopback (its real series): each scrape first answers 100 more requests, 1
    of them a 503, and 100 more first tokens, 10 of them at 400 ms (later than the 300 ms SLO) and 90 at 100 ms."""

    def __init__(self) -> None:
        self.metrics = GatewayMetrics()
        metrics = self.metrics

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                metrics.requests.labels("demo", MODEL, "200").inc(99)
                metrics.requests.labels("demo", MODEL, "503").inc(1)
                for seconds in [0.1] * 90 + [0.4] * 10:
                    metrics.ttft.labels("demo", MODEL).observe(seconds)
                body = metrics.render()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
                del format, args  # Unused: keep the test output clean.

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway() -> Iterator[ServedGateway]:
    served = ServedGateway()
    yield served
    served.close()


@pytest.fixture
def prometheus(tmp_path: Path, gateway: ServedGateway) -> Iterator[str]:
    """Prometheus 2.x scraping ``gateway`` every second, its TSDB in tmp_path."""
    with running_prometheus(tmp_path, f"127.0.0.1:{gateway.port}") as url:
        yield url


def test_slo_reads_the_spend_from_prometheus(
    prometheus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = stacks.write_stack(tmp_path / "Pulumi.budget.yaml", "local-sim")

    def scraped_thrice() -> bool:
        result = query(
            prometheus, f'count_over_time(llmfleet_gateway_requests_total{{status="503",model="{MODEL}"}}[5m])'
        )
        return bool(result) and float(result[0]["value"][1]) >= 3

    wait_for(scraped_thrice, timeout_s=40.0, what="three scrapes of the gateway in Prometheus", interval_s=0.5)

    assert main(["slo", "--stack", str(stack), "--prometheus", prometheus, "--json"]) == 0
    [pool] = json.loads(capsys.readouterr().out)
    by_slo = {b["slo"]: b for b in pool["slos"]}
    # Every scrape adds the same mix, so whatever increase() extrapolates, the ratios are exact: 1% 5xx against
    # 0.1% allowed (10x) and 0.5% (2x); 8% of first tokens late against 1% (8x): 90 within, and a fifth of the 10
    # in (0.25 s, 0.5 s] counted within 300 ms. The counts cover the whole 30-day window, so spent = burn rate.
    assert by_slo["availability"]["spent"] == pytest.approx(10.0, rel=1e-6)
    assert by_slo["error-rate"]["spent"] == pytest.approx(2.0, rel=1e-6)
    assert by_slo["ttft"]["spent"] == pytest.approx(8.0, rel=1e-6)
    assert {b["status"] for b in pool["slos"]} == {"exhausted"}
    assert not pool["allows_changes"] and pool["source"] == "prometheus"

    assert main(["slo", "--stack", str(stack), "--prometheus", prometheus]) == 0
    table = capsys.readouterr().out
    assert "risky changes: FROZEN" in table
    assert "availability   99.900%" in table and "exhausted" in table


def test_slo_and_status_show_the_control_planes_budget(
    tmp_path: Path, gateway: ServedGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = stacks.write_stack(tmp_path / "Pulumi.budget.yaml", "local-sim", **{"gateway.adminPort": gateway.port})
    port = free_port()
    argv = ["control-plane", "--stack", str(stack), "--port", str(port), "--dry-run", "--auth", "none"]
    cp = Proc(Child("control-plane", argv, tmp_path / "control-plane.log"), f"http://127.0.0.1:{port}")
    try:
        cp.wait_http("/healthz")
        assert main(["slo", "--stack", str(stack), "--control-plane", cp.url]) == 0
        table = capsys.readouterr().out
        assert "pool qwen-7b  window 30d  source local" in table
        assert "availability   99.900%" in table and "risky changes: allowed" in table

        assert main(["status", "--stack", str(stack), "--control-plane", cp.url]) == 0
        assert "error budget 30d spent: availability 0%, ttft 0%, error-rate 0% (ok)" in capsys.readouterr().out
    finally:
        cp.kill()


def test_a_frozen_pool_reads_frozen_with_its_reason() -> None:
    slo = SloBudget(
        slo="availability",
        target=0.999,
        window="30d",
        good=9990,
        bad=10,
        total=10_000,
        excluded_requests=250,
        excluded_s=2 * 3600,
        covered_s=30 * 86400,
        burn_rate=1.0,
        spent=1.0,
        remaining=0.0,
        status="exhausted",
    )
    reason = "a risky change refused on pool 'qwen-7b': its error budget is exhausted"
    budget = PoolBudget(
        pool="qwen-7b",
        source="local",
        computed_at=1.0,
        freeze=True,
        allows_changes=False,
        reason=reason,
        slos=[slo],
    )
    text = format_budgets([budget])
    assert "counted 30d0h00m of the window; planned restart windows excluded: 2h00m (250 requests)" in text
    assert "availability   99.900%      9,990       10     10,000   1.00x   100.0%      0.0%  exhausted" in text
    assert f"risky changes: FROZEN ({reason})" in text
