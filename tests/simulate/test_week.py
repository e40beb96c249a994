"""The week in virtual time: engine ages under a restart window, and ageing engines that serve slower."""

from __future__ import annotations

import dataclasses
from datetime import time

from fleet.spec.pool import RestartWindowSpec
from simulate.configs import Config
from simulate.replay import prepare, run_config
from simulate.report import row
from simulate.trace import synthetic_trace
from simulate.week import engine_age_h, restart_minutes, week_configs, week_report
from tests.support.stacks import pool as pool_spec

PROD_WINDOW = RestartWindowSpec(enabled=True, start=time(3, 0), min_uptime_hours=48)


def test_a_window_restarts_an_engine_on_the_first_day_it_has_been_up_long_enough() -> None:
    ages = [engine_age_h(day, 14.0, PROD_WINDOW) for day in range(7)]
    # Up 51 h at day 3's 03:00: restarted, 11 h at 14:00; 48 h again at day 5's 03:00.
    assert ages == [14.0, 38.0, 11.0, 35.0, 11.0, 35.0, 11.0]


def test_without_a_window_or_with_it_disabled_an_engine_only_grows_older() -> None:
    never = [engine_age_h(day, 14.0, None) for day in range(7)]
    assert never == [14.0 + 24.0 * day for day in range(7)]
    off = PROD_WINDOW.model_copy(update={"enabled": False})
    assert [engine_age_h(day, 14.0, off) for day in range(7)] == never


def test_an_hour_before_the_window_sees_the_engine_not_yet_restarted() -> None:
    assert engine_age_h(2, 2.0, PROD_WINDOW) == 50.0
    assert engine_age_h(2, 3.0, PROD_WINDOW) == 0.0


def test_the_week_has_a_row_per_day_and_policy_with_the_age_of_that_day() -> None:
    own = Config("p2c", "fixed", 2)
    pool = pool_spec("local-sim").model_copy(update={"restart_window": PROD_WINDOW})
    rows = week_configs(own, pool, 14.0)
    assert [(d, p) for d, p, _ in rows][:4] == [(0, "windows"), (0, "none"), (1, "windows"), (1, "none")]
    ages = {(d, p): c.age_s / 3600.0 for d, p, c in rows}
    assert ages[6, "windows"] == 11.0 and ages[6, "none"] == 158.0
    low, high = restart_minutes(pool, 3)
    assert (low, high) == (
        3 * pool.cold_start_seconds / 60.0,
        3 * (pool.drain.grace_seconds + pool.cold_start_seconds) / 60.0,
    )


def test_engines_a_week_old_serve_the_same_hour_slower_than_fresh_ones() -> None:
    prepared = prepare("prod", synthetic_trace(8.0, seed=2, end_s=120.0))
    sim = prepared.pool.engine.sim.model_copy(update={"degradation_per_72h": 0.2})
    aged_pool = prepared.pool.model_copy(update={"engine": prepared.pool.engine.model_copy(update={"sim": sim})})
    aged = dataclasses.replace(prepared, pool=aged_pool)
    fresh = row(run_config(aged, Config("p2c", "fixed", 3, age_s=0.0), seed=0), aged)
    old = row(run_config(aged, Config("p2c", "fixed", 3, age_s=158 * 3600.0), seed=0), aged)
    assert float(old["busy"]) > float(fresh["busy"]) * 1.3  # 44% slower engines: busy longer for the same work
    assert float(old["ttft_p99"]) > float(fresh["ttft_p99"])
    # Without degradation age changes nothing.
    flat = row(run_config(prepared, Config("p2c", "fixed", 3, age_s=158 * 3600.0), seed=0), prepared)
    assert flat["busy"] == row(run_config(prepared, Config("p2c", "fixed", 3), seed=0), prepared)["busy"]


def test_the_report_names_the_window_and_prints_fourteen_rows() -> None:
    prepared = prepare("prod", synthetic_trace(5.0, seed=2, end_s=30.0))
    report = week_report(prepared, Config("p2c", "fixed", 2), 14.0, 0.2, seed=0, jobs=1)
    lines = report.splitlines()
    assert sum(1 for line in lines if line.split()[:1] and line.split()[0].isdigit()) == 14
    assert "restartWindow: from 03:00 UTC" in report
