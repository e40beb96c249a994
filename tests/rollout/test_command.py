"""``llmfleet rollout``: what it asks for, how it shows a rollout, and its exit status when it cannot ask."""

from __future__ import annotations

import pytest

from fleet.protocol.ports import free_port
from llmfleet.cli import main
from rollout.rollout_cli import format_rollout

ROLLOUT = {
    "alias": "chat",
    "baseline": "qwen-v1",
    "candidate": "qwen-v2",
    "phase": "baking",
    "steps": [10, 50, 100],
    "step": 1,
    "weight": 50,
    "bake_s": 3.0,
    "min_samples": 20,
    "tolerance": 0.1,
    "metrics": ["TTFT p99", "TPOT p99", "error rate"],
    "step_started_at": 0.0,
    "reason": "baking 50%: 1 s of 3 s",
    "window": [
        {"pool": "qwen-v1", "requests": 40, "errors": 0, "error_rate": 0.0, "ttft_p99_s": 0.05, "tpot_p99_s": 0.02},
        {"pool": "qwen-v2", "requests": 0, "errors": 0, "error_rate": None, "ttft_p99_s": None, "tpot_p99_s": None},
    ],
}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rollout", "start", "--candidate", "qwen-v2"], "--alias is required"),
        (["rollout", "start", "--alias", "chat"], "--candidate is required"),
        (["rollout", "abort"], "--alias is required"),
    ],
)
def test_missing_arguments_exit_2_saying_which(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_an_unreachable_control_plane_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["rollout", "status", "--control-plane", url]) == 2
    assert "not reachable" in capsys.readouterr().err


def test_a_rollout_shows_its_weights_step_reason_and_both_sides() -> None:
    text = format_rollout(ROLLOUT)
    assert text.splitlines()[0].startswith("rollout chat: qwen-v1 -> qwen-v2 at 50% (step 2 of 3; steps 10/50/100%")
    assert "baking 50%: 1 s of 3 s" in text
    assert "qwen-v1" in text and "50.0ms" in text and "20.0ms" in text
    assert "requests      0  errors       -" in text  # a side with nothing measured yet
