"""``llmfleet plan``'s prefill/decode verdict: "does not pay" on prod's short prompts, "pays" on long prompts under
prod's inter-token target, each with the figures behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.cli import main
from tests.support.stacks import write_stack


def _verdict(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("prefill/decode disaggregation, pool "))
    return [line.strip() for line in lines[start + 1 :] if line.startswith("  ")][:4]


def test_prod_short_prompts_do_not_pay_and_plan_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "prod"]) == 0
    verdict = _verdict(capsys.readouterr().out)
    assert verdict[0].startswith("does not pay: no prompt's uncached tokens (200 on average) exceed the 1000-token")
    # and what splitting would cost even were every prompt prefilled remotely
    assert verdict[1].startswith("with every prompt prefilled remotely: does not pay")


def test_long_prompts_pay_with_the_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = {"meanPromptTokens": 2000, "meanOutputTokens": 200, "peakQps": 20, "capacityBuffer": 0.3}
    stack = write_stack(tmp_path / "Pulumi.long-prompts.yaml", "prod", **{"pools.0.workload": workload})
    assert main(["plan", "--stack", str(stack)]) == 0
    verdict = _verdict(capsys.readouterr().out)
    assert verdict[0].startswith("pays: ")
    assert "aggregated: " in verdict[1] and "prefill + " in verdict[1] and "KV transfer" in verdict[1]


def test_a_threshold_above_the_prompts_keeps_them_aggregated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = {"meanPromptTokens": 2000, "meanOutputTokens": 200, "peakQps": 20}
    stack = write_stack(tmp_path / "Pulumi.long-prompts.yaml", "prod", **{"pools.0.workload": workload})
    assert main(["plan", "--stack", str(stack), "--pd-threshold", "4096"]) == 0
    assert _verdict(capsys.readouterr().out)[0].startswith("does not pay: no prompt's uncached tokens (2000")


def test_a_negative_threshold_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "prod", "--pd-threshold", "-1"]) == 2
    assert "--pd-threshold -1: give 0 or more" in capsys.readouterr().err
