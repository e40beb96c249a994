"""Trace readers: the Azure CSV, Mooncake and llmfleet JSONL formats, errors naming file and line, scaling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulate.trace import TraceError, TraceRequest, read_trace, scale_trace, synthetic_trace

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8

2023-11-16 18:17:05.5000000,12,100
"""


def test_azure_csv_is_read_relative_to_its_first_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "code.csv"
    path.write_text(AZURE)
    trace = read_trace(path)
    assert [(round(r.t, 4), r.prompt_tokens, r.output_tokens) for r in trace] == [
        (0.0, 4808, 10),
        (0.052, 3180, 8),
        (1.5200, 12, 100),
    ]
    assert all(r.prefix_blocks == () for r in trace)


def test_mooncake_jsonl_keeps_hash_ids_and_ms_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl"
    lines = [
        {"timestamp": 40, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]},
        {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    trace = read_trace(path)
    assert [(r.t, r.prompt_tokens, r.output_tokens, r.prefix_blocks) for r in trace] == [
        (0.0, 600, 4, (0, 1)),
        (0.04, 1100, 6, (0, 1, 2)),
    ]


def test_llmfleet_jsonl_with_optional_prefix_blocks(tmp_path: Path) -> None:
    path = tmp_path / "own.jsonl"
    path.write_text(
        '{"t": 1.5, "prompt_tokens": 812, "output_tokens": 95}\n'
        '{"t": 2, "prompt_tokens": 2040, "output_tokens": 12, "prefix_blocks": [7, 8, 9]}\n'
    )
    assert read_trace(path) == [
        TraceRequest(0.0, "own-1", 812, 95),
        TraceRequest(0.5, "own-2", 2040, 12, (7, 8, 9)),
    ]


@pytest.mark.parametrize(
    ("name", "text", "line", "words"),
    [
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,1\nnot a date,1,1\n", 3, ""),
        ("b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,-4,1\n", 2, "ContextTokens"),
        ("c.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,4\n", 2, "3 columns"),
        ("d.csv", "time,in,out\n", 1, "header"),
        ("e.jsonl", '{"t": 0, "prompt_tokens": 5, "output_tokens": 1}\n{"t": 1, "prompt_tokens": 5\n', 2, ""),
        ("f.jsonl", '{"t": 0, "prompt_tokens": 0, "output_tokens": 1}\n', 1, "prompt_tokens"),
        ("g.jsonl", '\n{"timestamp": 1, "input_length": 9, "output_length": 1, "hash_ids": ["x"]}\n', 2, "hash_ids"),
        ("h.jsonl", '{"timestamp": 1, "input_length": 9}\n', 1, "output_length"),
        ("i.jsonl", "[1, 2]\n", 1, "object"),
    ],
)
def test_a_malformed_line_names_the_file_and_line(tmp_path: Path, name: str, text: str, line: int, words: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=rf"{name}:{line}: .*{words}"):
        read_trace(path)


def test_missing_and_empty_files_are_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no requests"):
        read_trace(tmp_path / "empty.jsonl")


def test_time_scale_compresses_and_rate_scale_replays_copies_with_the_same_shape() -> None:
    trace = [TraceRequest(float(i * 10), f"r{i}", 100, 10) for i in range(100)]
    faster = scale_trace(trace, time_scale=0.5)
    assert [r.t for r in faster] == [i * 5.0 for i in range(100)]
    doubled = scale_trace(trace, rate_scale=2.0, seed=1)
    assert len(doubled) == 200 and len({r.rid for r in doubled}) == 200
    # each copy lands between its original and the next arrival (10 s later here)
    assert all(0 <= c.t - float(c.rid.split(".")[0][1:]) * 10 < 10.0 for c in doubled)
    assert max(c.t - float(c.rid.split(".")[0][1:]) * 10 for c in doubled) > 5.0
    thinned = scale_trace(trace, rate_scale=0.5, seed=1)
    assert 30 < len(thinned) < 70
    assert scale_trace(trace, rate_scale=1.5, seed=3) == scale_trace(trace, rate_scale=1.5, seed=3)
    with pytest.raises(ValueError):
        scale_trace(trace, rate_scale=0)


def test_synthetic_trace_is_seeded() -> None:
    assert synthetic_trace(5.0, 1, end_s=100) == synthetic_trace(5.0, 1, end_s=100)
    assert synthetic_trace(5.0, 1, end_s=100)
