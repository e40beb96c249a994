"""``llmfleet plan``'s prefill/decode verdict: "does not pay" on prod's short prompts, "pays" on long prompts under
prod's inter-token target, each with the figures behind it."""

from __future__ import annotations

import json
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
    # and the figures behind that
    assert verdict[2].startswith("the figures then: aggregated: ") and "prefill + " in verdict[2]
    assert "KV transfer" in verdict[2]


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


def test_the_long_prompt_stack_pays_with_the_figures_and_its_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "prod-long-prompt"]) == 0
    out = capsys.readouterr().out
    assert "pool qwen-7b (threshold 1000 uncached tokens):" in out
    verdict = _verdict(out)
    assert verdict[0].startswith("pays: ") and "8000-token prompts" in verdict[0]
    assert "prefill + " in verdict[1] and "KV transfer" in verdict[1]
    assert "the stack disaggregates this pool: prefill.replicas 1..12" in out


def test_a_disaggregated_pools_threshold_is_the_stacks_unless_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = write_stack(
        tmp_path / "Pulumi.high.yaml", "prod-long-prompt", **{"pools.0.disaggregation.thresholdTokens": 9000}
    )
    assert main(["plan", "--stack", str(stack)]) == 0
    out = capsys.readouterr().out
    assert "(threshold 9000 uncached tokens)" in out
    assert _verdict(out)[0].startswith("does not pay: no prompt's uncached tokens (8000 on average) exceed the 9000")
    assert main(["plan", "--stack", str(stack), "--pd-threshold", "1000"]) == 0
    assert _verdict(capsys.readouterr().out)[0].startswith("pays: ")


def test_bounds_below_what_the_targets_ask_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capped = {"pools.0.disaggregation.prefill.replicas": {"min": 1, "max": 2}, "pools.0.replicas.min": 1}
    stack = write_stack(tmp_path / "Pulumi.capped.yaml", "prod-long-prompt", **capped)
    assert main(["plan", "--stack", str(stack)]) == 0
    out = capsys.readouterr().out
    assert "prefill.replicas.max 2 is under the 7 prefill replicas the TTFT target asks for at peak" in out
    assert "fit the stack's bounds" not in out


def test_plan_json_carries_the_verdict_and_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "prod", "--json"]) == 0
    (prod,) = json.loads(capsys.readouterr().out)["disaggregation"]
    assert (prod["pool"], prod["pays"], prod["threshold_tokens"], prod["disaggregated_in_stack"]) == (
        "qwen-7b",
        False,
        1000,
        False,
    )
    assert prod["reasons"][0].startswith("does not pay: ") and prod["stack_bounds"] == []
    assert main(["plan", "--stack", "prod-long-prompt", "--json"]) == 0
    (long,) = json.loads(capsys.readouterr().out)["disaggregation"]
    assert long["pays"] is True and long["disaggregated_in_stack"] is True
    sizing = long["sizing"]
    assert sizing["split"] == sizing["prefill"] + sizing["decode"] < sizing["aggregated"]
    assert sizing["prefill_s"] > 0 and sizing["transfer_s"] > 0 and sizing["aggregated_itl_p99_s"] > 1 / 30
