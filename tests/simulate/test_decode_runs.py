"""A replay with decode runs (many decode steps per event) gives the results of one event per engine step, and
its scrapes read what they read then."""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import Any

import pytest

from fleet.spec.loader import load_spec
from llmfleet.registries import all_registries
from simulate.configs import Config, make_controller, make_router
from simulate.fleet_sim import FleetSim
from simulate.replay import Prepared, prepare
from simulate.result import Result
from simulate.trace import TraceRequest, synthetic_trace


class RecordingSim(FleetSim):
    """Keeps what every scrape read from every replica (the gateway's and the scaler's view)."""

    seen: list[Any]

    def on_scrape(self, now: float, payload: Any) -> None:
        super().on_scrape(now, payload)
        self.seen.append([(r.name, r.scraped, r.scheduler.stats.generation_tokens) for r in self.replicas])


def _trace() -> list[TraceRequest]:
    # Shared prompt heads, a third of the answers long: replicas admit often and also decode alone for long runs.
    base = synthetic_trace(12.0, seed=3, end_s=150.0)
    return [r if i % 3 else replace(r, output_tokens=300) for i, r in enumerate(base)]


def _replay(prepared: Prepared, config: Config, decode_runs: bool) -> tuple[dict[str, Any], list[Any]]:
    spec = load_spec(prepared.stack, registries=all_registries()).spec
    controller = make_controller(spec, prepared.pool, config.scaling)
    sim = RecordingSim(
        spec,
        prepared.pool,
        make_router(spec, config.routing, 7),
        controller,
        prepared.trace,
        initial_replicas=prepared.fixed_replicas if controller is None else prepared.initial_replicas,
        decode_runs=decode_runs,
    )
    sim.seen = []
    return _figures(sim.run()), sim.seen


def _figures(result: Result) -> dict[str, Any]:
    """Everything a run produced but its wall time; ITLs sorted (runs record them per run, not per step), NaN
    made comparable."""
    fields = asdict(result)
    fields.pop("wall_s")
    fields["itls"] = sorted(result.itls)
    fields["timeline"] = [tuple("nan" if v != v else v for v in row) for row in result.timeline]
    return fields


@pytest.mark.parametrize("config", [Config("p2c+prefix", "target-tracking+predictive"), Config("random", "fixed")])
def test_decode_runs_change_no_figure_of_a_replay_and_no_scrape(config: Config) -> None:
    prepared = prepare("prod", _trace())
    stepped, stepped_seen = _replay(prepared, config, decode_runs=False)
    batched, batched_seen = _replay(prepared, config, decode_runs=True)
    assert stepped["completed"] == len(prepared.trace) and len(stepped["itls"]) > 10 * stepped["completed"]
    assert not math.isnan(stepped["busy_s"])
    assert batched == stepped
    assert batched_seen == stepped_seen
