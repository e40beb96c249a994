"""Plotting: the benchmarks' shared ``--plot DIR`` option and figure saving; each bench draws what it prints.

Figures go to ``bench/out/`` by default (ignored by git), next to the printed tables; ``--plot DIR`` moves them,
``--no-plot`` skips them. matplotlib is imported only when a figure is drawn (Agg backend, no display).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmfleet.local.plots import pyplot  # noqa: E402

__all__ = ["OUT", "add_plot_arguments", "pyplot", "save"]

OUT = Path(__file__).resolve().parent / "out"


def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plot", type=Path, default=OUT, metavar="DIR", help=f"write the figures as PNG into DIR (default {OUT})"
    )
    parser.add_argument("--no-plot", dest="plot", action="store_const", const=None, help="draw no figure")


def save(plt: ModuleType, fig: Any, directory: Path, name: str) -> Path:
    """Save ``fig`` as ``directory/name`` (created), close it, and say where it went."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    print(f"figure: {path}")
    return path
