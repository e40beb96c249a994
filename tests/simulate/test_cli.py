"""``llmfleet simulate`` end to end on a small trace: the table, the dropped requests, the plot, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfleet.cli import main
from simulate.cli import configs_for
from simulate.configs import ROUTINGS, SCALINGS, Config, make_controller, make_router, stack_config
from tests.support import stacks


def write_trace(path: Path) -> None:
    lines = []
    for i in range(60):
        blocks = [1, 2, 3 + i % 3] if i % 2 else []
        lines.append({"t": i * 0.5, "prompt_tokens": 700 + 10 * i, "output_tokens": 8, "prefix_blocks": blocks})
    lines.append({"t": 5.0, "prompt_tokens": 9000, "output_tokens": 8})  # above prod's maxModelLen 8192
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_simulate_runs_the_stacks_configuration_and_writes_a_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, png = tmp_path / "t.jsonl", tmp_path / "replay.png"
    write_trace(trace)
    argv = ["simulate", "--stack", "prod", "--trace", str(trace), "--jobs", "1"]
    assert main([*argv, "--plot", str(png), "--time-scale", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "time x0.5" in out
    assert "dropped: 1 requests (1.6%) longer than maxModelLen 8192" in out
    rows = [line for line in out.splitlines() if line.startswith("work+kv / target-tracking+predictive ")]
    assert len(rows) == 1
    assert "clairvoyant bound" in out and "infinite shared cache hit rate" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_configuration_of_the_factorial_builds_from_the_real_plugins() -> None:
    spec = stacks.spec("prod")
    own = stack_config(spec)
    assert own == Config("work+kv", "target-tracking+predictive")
    assert configs_for("routing", own) == [Config(r, own.scaling) for r in ROUTINGS]
    assert configs_for("scaling", own) == [Config(own.routing, s) for s in SCALINGS]
    assert configs_for(None, own) == [own]
    assert configs_for("seed", own) == [Config("random", "threshold"), own]
    assert configs_for("oracle", own) == [own, Config(own.routing, "oracle")]
    every = configs_for("all", own)
    assert len(set(every)) == len(ROUTINGS) * len(SCALINGS) == 35
    for config in every:
        router = make_router(spec, config.routing, seed=1)
        p2c = config.routing.startswith("p2c") or config.routing == "oracle-kv"
        assert router.picker.name == ("p2c" if p2c else "least-work" if config.routing == "work+kv" else config.routing)
        names = [s.name for s, _ in router.scorers]
        assert ("prefix-affinity" in names) == (config.routing == "p2c+prefix")
        assert ("kv-cache" in names) == (config.routing in ("p2c+kv", "work+kv"))
        assert ("oracle-kv" in names) == (config.routing == "oracle-kv")
        if config.scaling == "oracle":  # built from the trace (tests/simulate/test_oracle.py)
            with pytest.raises(ValueError, match="built from the trace"):
                make_controller(spec, spec.pools[0], config.scaling)
            continue
        controller = make_controller(spec, spec.pools[0], config.scaling)
        if config.scaling == "fixed":
            assert controller is None
        else:
            assert controller is not None
            assert controller.policy.name == config.scaling.removesuffix("+predictive")
            assert controller.autoscaling.predictive == config.scaling.endswith("+predictive")


def test_a_bad_trace_line_exits_2_naming_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"t": 0, "prompt_tokens": 10, "output_tokens": 1}\n{"t": "soon"}\n')
    assert main(["simulate", "--trace", str(trace)]) == 2
    assert f"{trace}:2: t must be" in capsys.readouterr().err


def test_routing_and_fixed_choose_the_rows_size_by_size() -> None:
    own = Config("p2c+prefix", "target-tracking+predictive")
    routers = ["p2c+prefix", "p2c+kv", "oracle-kv"]
    assert configs_for(None, own, routers) == [Config(r, own.scaling) for r in routers]
    assert configs_for(None, own, (), [5]) == [Config("p2c+prefix", "fixed", 5)]
    assert configs_for("routing", own, (), [5, 8]) == [Config(r, "fixed", n) for n in (5, 8) for r in ROUTINGS]
    assert configs_for(None, own, routers, [5, 8])[3:] == [Config(r, "fixed", 8) for r in routers]
    with pytest.raises(ValueError, match="choose from"):
        configs_for(None, own, ["p2c+kvv"])
    with pytest.raises(ValueError, match="picks its own rows"):
        configs_for("oracle", own, routers)


def test_the_kv_routings_and_the_oracle_weigh_as_the_stacks_prefix_affinity() -> None:
    spec = stacks.spec("prod")
    weights = {
        routing: {s.name: w for s, w in make_router(spec, routing, seed=1).scorers}
        for routing in ("p2c", "p2c+prefix", "p2c+kv", "oracle-kv")
    }
    load = weights["p2c"]
    assert weights["p2c+kv"] == {**load, "kv-cache": weights["p2c+prefix"]["prefix-affinity"]}
    assert weights["oracle-kv"] == {**load, "oracle-kv": weights["p2c+kv"]["kv-cache"]}
    kv, oracle = (make_router(spec, r, seed=1).scorers[-1][0] for r in ("p2c+kv", "oracle-kv"))
    assert kv.min_share == oracle.min_share == 0.5  # the same minShare, the same bound
    assert kv.spares_prefill and oracle.spares_prefill


def test_simulate_with_the_oracle_router_prints_the_oracle_column_and_the_miss_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace)
    argv = ["simulate", "--stack", "prod", "--trace", str(trace), "--jobs", "1", "--fixed", "3"]
    assert main([*argv, "--routing", "p2c+kv,oracle-kv", "--kv-delay-ms", "20"]) == 0
    out = capsys.readouterr().out
    assert "/oracle" in out.splitlines()[5] and "spread" in out.splitlines()[5]
    assert [line.split()[0] for line in out.splitlines()[6:8]] == ["p2c+kv", "oracle-kv"]
    assert out.splitlines()[7].split()[21] == "100.0%"  # the oracle's own row, after hit and /ceil
    assert "oracle-kv / fixed 3: miss" in out and "lost by routing" in out
    png = tmp_path / "kv.png"
    assert main([*argv, "--routing", "p2c", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "/oracle" not in out and "miss split" not in out
    assert not (tmp_path / "kv-routing.png").exists()  # one router: nothing to set side by side
    assert main([*argv, "--routing", "p2c,p2c+kv", "--plot", str(png)]) == 0
    assert f"plot: {tmp_path / 'kv-routing.png'}" in capsys.readouterr().out
    assert (tmp_path / "kv-routing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([*argv, "--kv-delay-ms", "-1"]) == 2
    assert "--kv-delay-ms -1" in capsys.readouterr().err
