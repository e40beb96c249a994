"""``llmfleet gate`` end to end: two simulators started through the agent's launcher, the same sweep side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmfleet.cli import main
from tests.support import stacks

# Short outputs and a slowed clock keep the host's share of the measurement small on a busy two-core machine.
FAST = ["--time-scale", "0.25", "--requests-per-step", "40", "--rates", "0.5,1,1.5"]


@pytest.fixture
def two_pools(tmp_path: Path) -> Path:
    """The local stack with a second, identical pool (a candidate) and a short token mix."""
    document = stacks.stack_document("local")
    pools = document["config"]["llmfleet:pools"]
    pools[0]["workload"] = {"meanPromptTokens": 200, "meanOutputTokens": 24, "peakQps": 20}
    pools.append({**pools[0], "name": "qwen-7b-v2", "servedModelName": "qwen2.5-7b-instruct-v2"})
    path = tmp_path / "Pulumi.gate.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def gate(stack: Path, out: Path, *extra: str) -> tuple[int, dict[str, object]]:
    code = main(["gate", "--stack", str(stack), "--baseline", "qwen-7b", "--candidate", "qwen-7b-v2", *FAST,
                 "--json", str(out), *extra])  # fmt: skip
    return code, json.loads(out.read_text())


def test_the_gate_passes_an_identical_candidate_and_fails_a_slower_one_naming_the_metric(
    two_pools: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, same = gate(two_pools, tmp_path / "same.json")
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "gate: PASS" in printed and same["passed"] is True

    # Every engine step twice as long: a candidate half as fast, far outside the noise a busy machine adds to 40
    # requests' p99s (a 1.25x one sometimes lands within the 10%).
    code, slow = gate(two_pools, tmp_path / "slow.json", "--degradation", "2")
    printed = capsys.readouterr().out
    assert code == 1, printed
    worse = [d["metric"] for d in slow["deltas"] if d["worse"]]  # type: ignore[union-attr]
    # Which of them cross the 10% depends on where the slower engine's queue builds; at least one does, and the
    # verdict names each.
    assert worse and slow["passed"] is False
    assert printed.splitlines()[-1] == f"gate: FAIL: {', '.join(worse)} worse than 10%"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--candidate", "nope"], "--candidate 'nope': no such pool; pools: qwen-7b, qwen-7b-v2"),
        (["--rates", "1,x"], "--rates '1,x'"),
        (["--tolerance", "2"], "--tolerance 2.0"),
        (["--degradation", "0.5"], "--degradation"),
    ],
)
def test_bad_gate_arguments_exit_2_with_the_reason(
    two_pools: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["gate", "--stack", str(two_pools), "--baseline", "qwen-7b", "--candidate", "qwen-7b-v2", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
