"""``llmfleet simulate --compare pd`` on a pool the stack disaggregates: its ``thresholdTokens`` when no
``--pd-threshold`` is given, a sweep when one is, and its ``prefill.replicas`` bounding each split
(`simulate.pd.pd_configs`, `fleet.capacity.disagg_split.split_roles`)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fleet.capacity.disagg_plan import RoleSizing
from llmfleet.cli import main
from simulate.pd import PdConfig, pd_configs
from tests.support.stacks import write_stack


def _sizing(prefill: int, decode: int) -> RoleSizing:
    return RoleSizing(prefill, decode, prefill + decode, 0.3, 0.01, 0.5, 0.15, 0.02)


@pytest.mark.parametrize(
    ("name", "sized", "bounds", "split"),
    [
        ("the targets' proportion", (6, 2), (1, None), (6, 2)),
        ("the stack's prefill max caps it", (6, 2), (1, 3), (3, 5)),
        ("the stack's prefill min floors it", (1, 7), (4, 6), (4, 4)),
        ("a 0 floor still runs one prefill replica", (0, 8), (0, None), (1, 7)),
        ("never every replica prefilling", (9, 0), (1, None), (7, 1)),
    ],
)
def test_each_split_spends_the_aggregated_pools_replicas_within_the_bounds(
    name: str, sized: tuple[int, int], bounds: tuple[int, int | None], split: tuple[int, int]
) -> None:
    aggregated, disaggregated = pd_configs("p2c", [8], [(1000, _sizing(*sized))], bounds)
    assert aggregated == PdConfig("p2c", 8), name
    assert (disaggregated.prefill, disaggregated.decode, disaggregated.threshold) == (*split, 1000), name


def _long_prompts(path: Path) -> Path:
    rng, t, lines = random.Random(3), 0.0, []
    while t < 20.0:
        t += rng.expovariate(4.0)
        prompt = max(16, round(rng.gauss(3000, 600)))
        lines.append(f'{{"t": {t:.3f}, "prompt_tokens": {prompt}, "output_tokens": {rng.randint(40, 120)}}}')
    path.write_text("\n".join(lines) + "\n")
    return path


def test_compare_pd_reads_the_stacks_threshold_and_bounds_and_still_sweeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pd = {"thresholdTokens": 1500, "prefill": {"replicas": {"min": 1, "max": 1}}}
    stack = write_stack(tmp_path / "Pulumi.pd-declared.yaml", "prod", **{"pools.0.disaggregation": pd})
    args = ["simulate", "--stack", str(stack), "--trace", str(_long_prompts(tmp_path / "t.jsonl")), "--compare", "pd"]
    assert main([*args, "--fixed", "4", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "threshold 1500:" in out and "prefill.replicas 1..1 bound each split; thresholdTokens 1500" in out
    # long prompts ask for more prefill than decode replicas; the stack allows one
    assert "1P+3D >1500 " in out and ">1000 " not in out
    assert main([*args, "--fixed", "4", "--jobs", "1", "--pd-threshold", "512,2048"]) == 0
    out = capsys.readouterr().out
    assert "1P+3D >512 " in out and "1P+3D >2048 " in out and ">1500 " not in out


def test_compare_pd_on_a_plain_pool_takes_the_default_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--stack", "prod", "--trace", str(_long_prompts(tmp_path / "t.jsonl")), "--compare", "pd"]
    assert main([*args, "--fixed", "4", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "threshold 1000:" in out and "bound each split" not in out
    assert "3P+1D >1000 " in out  # unbounded: the TTFT target's share of four
