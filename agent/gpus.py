"""GPUs: the node's GPU inventory from ``nvidia-smi`` (empty where there is none, e.g. simulated engines), and the
device the engine runs on, decided from it once when the agent starts (`device_of`)."""

from __future__ import annotations

import asyncio
import csv
import io
import shutil
from collections.abc import Sequence
from typing import Literal

__all__ = ["QUERY_FIELDS", "Device", "device_of", "parse_gpus", "query_gpus"]

Device = Literal["gpu", "cpu"]

QUERY_FIELDS = ("index", "name", "uuid", "memory.total", "memory.used", "driver_version", "utilization.gpu")


def parse_gpus(text: str) -> list[dict[str, str]]:
    """Rows of ``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits`` as dicts."""
    rows = []
    for row in csv.reader(io.StringIO(text)):
        if not row or not "".join(row).strip():
            continue
        values = [cell.strip() for cell in row]
        if len(values) != len(QUERY_FIELDS):
            raise ValueError(f"unexpected nvidia-smi row ({len(values)} fields): {row!r}")
        rows.append(dict(zip(QUERY_FIELDS, values, strict=True)))
    return rows


async def query_gpus(executable: str | None = None, timeout_s: float = 5.0) -> list[dict[str, str]]:
    """The GPU inventory, or [] when nvidia-smi is absent or fails (never raises)."""
    path = executable or shutil.which("nvidia-smi")
    if path is None:
        return []
    try:
        process = await asyncio.create_subprocess_exec(
            path,
            f"--query-gpu={','.join(QUERY_FIELDS)}",
            "--format=csv,noheader,nounits",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        return []
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        return []
    try:
        return parse_gpus(out.decode()) if process.returncode == 0 else []
    except ValueError:
        return []


def device_of(gpus: Sequence[object]) -> Device:
    """``cpu`` when the inventory is empty (no nvidia-smi, or it lists no GPU), else ``gpu``."""
    return "gpu" if gpus else "cpu"
