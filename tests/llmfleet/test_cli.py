"""`llmfleet validate` and `llmfleet plan` as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llmfleet.cli import COMMANDS, main
from tests.support.stacks import write_stack

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmfleet.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_validate_all_shipped_stacks_exits_zero() -> None:
    result = run("validate")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ok ") == len(list((ROOT / "stacks").glob("Pulumi.*.yaml"))) >= 5


def test_validate_a_broken_file_exits_one_and_names_the_key(tmp_path: Path) -> None:
    path = write_stack(tmp_path / "Pulumi.bad.yaml", "aws", **{"llmfleet:pools.0.engine.gpuMemoryUtilization": 1.5})
    result = run("validate", str(path))
    assert result.returncode == 1
    assert "llmfleet:pools[0].engine.gpuMemoryUtilization" in result.stderr
    assert str(path) in result.stderr


def test_plan_prod_prints_six_replicas_at_peak() -> None:
    result = run("plan", "--stack", "prod")
    assert result.returncode == 0, result.stderr
    assert "replicas min/needed/peak/max  3 / 6 / 6 / 24" in result.stdout
    assert "56 KiB" in result.stdout


def test_hash_key_prints_the_stored_form(capsys: object) -> None:
    assert main(["hash-key", "sk-llmfleet-demo"]) == 0


def test_every_command_module_is_named_in_the_table() -> None:
    assert {"validate", "plan", "sim", "agent", "gateway", "control-plane", "up", "policy"} <= set(COMMANDS)
