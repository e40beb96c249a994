"""GPU inventory: nvidia-smi's CSV parsed into records; absent or broken nvidia-smi gives an empty list."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.gpus import parse_gpus, query_gpus

CSV = (
    "0, NVIDIA A100-SXM4-80GB, GPU-1111, 81920, 1024, 550.54.15, 37\n"
    "1, NVIDIA A100-SXM4-80GB, GPU-2222, 81920, 0, 550.54.15, 0\n\n"
)


def test_rows_become_records() -> None:
    gpus = parse_gpus(CSV)
    assert [g["uuid"] for g in gpus] == ["GPU-1111", "GPU-2222"]
    assert gpus[0] == {
        "index": "0", "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-1111", "memory.total": "81920",
        "memory.used": "1024", "driver_version": "550.54.15", "utilization.gpu": "37",
    }  # fmt: skip


def test_unexpected_shape_is_an_error() -> None:
    with pytest.raises(ValueError, match="fields"):
        parse_gpus("0, A100\n")


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (f"#!/bin/sh\nprintf '{CSV.splitlines()[0]}\\n'\n", 1),
        ("#!/bin/sh\nexit 9\n", 0),
        ("#!/bin/sh\necho 'garbage'\n", 0),
    ],
)
async def test_query_runs_nvidia_smi_and_never_raises(tmp_path: Path, script: str, expected: int) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(script)
    exe.chmod(0o755)
    assert len(await query_gpus(str(exe))) == expected


async def test_missing_binary_means_no_gpus(tmp_path: Path) -> None:
    assert await query_gpus(str(tmp_path / "absent")) == []
