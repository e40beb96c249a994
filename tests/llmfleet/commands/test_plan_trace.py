"""``llmfleet plan --stack S --trace T``: one frontier row per fleet size of each pool, and clear refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmfleet.cli import main


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "burst.jsonl"
    path.write_text(
        "".join(json.dumps({"t": i / 4, "prompt_tokens": 2000, "output_tokens": 20}) + "\n" for i in range(80))
    )
    return path


def test_plan_on_a_trace_prints_one_frontier_row_per_fleet_size(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--stack", "dev", "--trace", str(trace), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    sizes = [int(m) for m in re.findall(r"^\S+ / fixed (\d+) ", out, flags=re.M)]
    assert sizes == [1, 2, 3]  # dev's replicas.min .. replicas.max
    assert "pool qwen-7b" in out and "80 requests" in out and "GPU-h" in out


def test_plan_on_a_trace_chooses_sizes(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "dev", "--trace", str(trace), "--sizes", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["frontier"]["qwen-7b"]
    assert [r["peak"] for r in rows] == [3]


def test_a_missing_trace_is_named_with_the_formats_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.csv"
    assert main(["plan", "--stack", "dev", "--trace", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "no such trace file" in err and ".csv" in err and ".jsonl" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sizes", "0..9"], r"--sizes '0\.\.9': sizes of pool qwen-7b are 1\.\.3"),
        (["--sizes", "two"], r"give A\.\.B or a comma list"),
        (["--rate-scale", "0"], r"--rate-scale and --time-scale must be positive"),
        (["--jobs", "0"], r"--jobs 0: give 1 or more"),
        (["--duration", "-5"], r"--duration -5: give a positive number"),
    ],
)
def test_a_bad_flag_says_what_is_allowed(
    trace: Path, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--stack", "dev", "--trace", str(trace), *flags]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_malformed_trace_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 0, "prompt_tokens": 10, "output_tokens": 1}\n{"t": "soon"}\n')
    assert main(["plan", "--stack", "dev", "--trace", str(bad)]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err
