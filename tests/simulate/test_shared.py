"""Shared GPUs in the simulator: two pools of the two-model stack replayed together on one node group against the
same pools on groups of their own, and ``llmfleet simulate-shared``'s inputs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fleet.spec.loader import load_spec
from llmfleet.cli import main
from llmfleet.registries import all_registries
from simulate.configs import stack_config
from simulate.replay import Prepared, prepare
from simulate.shared import WAYS, run_separate, run_shared, run_way, separate_spec, shared_spec
from simulate.shared_cli import parse_pool_trace
from simulate.trace import synthetic_trace

STACK = "prod-two-models"
SPEC = load_spec(STACK, registries=all_registries()).spec


def _prepared(rates: dict[str, float], ramp_at: float | None = None) -> list[Prepared]:
    """Each pool a 300 s synthetic trace at its rate (requests per second); with ``ramp_at`` each ``ramp_at + 200``
    s, the first pool at a tenth of its rate until ``ramp_at``."""
    out = []
    for i, (name, rate) in enumerate(rates.items()):
        if ramp_at is not None and i == 0:
            # long outputs, so a few tens of requests a second need several replicas
            short = synthetic_trace(rate, i, ramp_at + 200, lambda t: 1.0 if t >= ramp_at else 0.1)
            trace = [dataclasses.replace(r, output_tokens=r.output_tokens * 8) for r in short]
        else:
            trace = synthetic_trace(rate, i, 300.0 if ramp_at is None else ramp_at + 200, lambda t: 1.0)
        out.append(prepare(STACK, trace, pool_name=name))
    return out


def test_the_two_pools_pay_the_groups_minimum_once_shared_and_twice_apart() -> None:
    prepared = _prepared({"qwen-7b": 2.0, "llama-8b": 2.0})
    own = stack_config(SPEC)
    apart = run_separate(SPEC, prepared, own, seed=0)
    shared = run_shared(SPEC, prepared, own, seed=0, way="shared")
    # Quiet traffic: each group's minimum (a p4de in each of three zones, 24 A100s) is all either way pays.
    span = max(r.end_s for r in shared.results)
    assert shared.paid_gpu_s == pytest.approx(24 * span, rel=0.05)
    assert apart.paid_gpu_s == pytest.approx(2 * 24 * max(r.end_s for r in apart.results), rel=0.05)
    for run in (apart, shared):
        assert [r.completed for r in run.results] == [len(p.trace) for p in prepared]
        assert all(r.paid_gpu_s == 0 for r in run.results) == (run is shared)  # the group pays, not a pool


def test_a_pools_growth_takes_the_other_pools_paid_gpus_instead_of_new_nodes() -> None:
    # One pool's demand grows after its first cold start beyond the half of the minimum the fixed split gives it
    # while the other pool idles: fixed, the group buys nodes; with the moving floor the idle pool yields its GPUs
    # (down to its own want) and the group pays less; with warm GPUs the moves are wakes and it pays least.
    prepared = _prepared({"qwen-7b": 150.0, "llama-8b": 1.0}, ramp_at=200.0)
    runs = {way: run_way(SPEC, prepared, stack_config(SPEC), 0, way) for way in ("fixed", "shared", "shared+wake")}
    assert runs["shared"].paid_gpu_s < runs["fixed"].paid_gpu_s
    assert runs["shared+wake"].paid_gpu_s < runs["shared"].paid_gpu_s
    assert runs["shared+wake"].wakes >= 1 and runs["shared"].wakes == 0
    for run in runs.values():
        assert [r.completed for r in run.results] == [len(p.trace) for p in prepared]


def test_an_unknown_way_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="allowed: separate, fixed, shared, shared\\+wake"):
        run_way(SPEC, _prepared({"qwen-7b": 1.0, "llama-8b": 1.0}), stack_config(SPEC), 0, "both")


def test_separate_groups_are_copies_named_for_their_pool_and_shared_ones_must_be_one_group() -> None:
    apart = separate_spec(SPEC, SPEC.pools)
    assert [p.node_group for p in apart.pools] == ["a100-qwen-7b", "a100-llama-8b"]
    assert {g.instance_type for g in apart.gpu_node_groups} == {"p4de.24xlarge"}
    assert all(g.min_nodes_per_az == 1 for g in apart.gpu_node_groups)
    with pytest.raises(ValueError, match="must share one GPU node group"):
        shared_spec(apart, apart.pools, wake=False)
    woken = shared_spec(SPEC, SPEC.pools, wake=True)
    assert all(p.replicas.fill_paid_nodes and not p.engine.sleep_mode for p in woken.pools)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("qwen-7b=code.csv", ("qwen-7b", "code.csv", 1.0)), ("llama-8b=conv.csv@8", ("llama-8b", "conv.csv", 8.0))],
)
def test_a_pool_trace_is_pool_file_and_an_optional_rate(text: str, parsed: tuple[str, str, float]) -> None:
    assert parse_pool_trace(text) == parsed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pool-trace", "qwen-7b"], "--pool-trace 'qwen-7b': give POOL=FILE or POOL=FILE@RATE"),
        (["--pool-trace", "qwen-7b=a.csv@0"], "with a rate above 0"),
        (["--pool-trace", "qwen-7b=a.csv@x"], "with a rate above 0"),
        (["--pool-trace", "qwen-7b=a.csv"], "give --pool-trace once for each of two or more pools"),
        (["--pool-trace", "qwen-7b=a.jsonl", "--pool-trace", "llama-8b=a.jsonl"], "no such trace file"),
        (["--pool-trace", "nope={t}", "--pool-trace", "qwen-7b={t}"], "has no pool 'nope'"),
        (["--pool-trace", "qwen-7b={t}", "--pool-trace", "llama-8b={t}", "--ways", "shared"], "give separate first"),
        (["--pool-trace", "qwen-7b={t}", "--pool-trace", "llama-8b={t}", "--ways", "separate,x"], "allowed: separate"),
    ],
)
def test_bad_inputs_exit_2_with_the_reason(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t": 0.5, "prompt_tokens": 100, "output_tokens": 10}\n')
    assert main(["simulate-shared", *(a.format(t=trace) for a in argv)]) == 2
    assert message in capsys.readouterr().err


def test_the_command_prints_each_way_per_pool_and_what_sharing_saves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [f'{{"t": {i * 0.5}, "prompt_tokens": 300, "output_tokens": 40}}' for i in range(120)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    argv = ["simulate-shared", "--pool-trace", f"qwen-7b={trace}", "--pool-trace", f"llama-8b={trace}@2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("simulate-shared: stack prod-two-models, ")
    assert "qwen-7b (120 requests), llama-8b (240 requests)" in out
    rows = [line.split()[:3] for line in out.splitlines() if line.split()[:1] in ([w] for w in WAYS)]
    assert [r[:2] for r in rows if r[1] in ("qwen-7b", "llama-8b")] == [
        [way, pool] for way in WAYS for pool in ("qwen-7b", "llama-8b")
    ]
    # Quiet traffic: one minimum paid instead of two.
    assert "shared pays 50.0% fewer GPU-hours than separate" in out
