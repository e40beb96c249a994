"""Fleet simulation bench: `llmfleet simulate` (the `simulate` package) on the seeded synthetic day-shaped trace.

A thin caller kept for the bench's old invocation; every option of ``llmfleet simulate`` passes through,
``--trace`` defaults to ``synthetic`` and ``--compare`` to ``seed``: the seed's baseline (random routing, the
threshold scaler) and the stack's own pair side by side in one run, each with its replica busy share (engine busy
time over replica time) next to its paid-GPU busy share (engine busy GPU time over the whole nodes paid), the
seed's 40% -> 75% claim measured on what is billed. It prints, it never asserts.

    .venv/bin/python bench/fleet_sim.py                          # prod pool: random / threshold, then the default
    .venv/bin/python bench/fleet_sim.py --compare all            # every router x scaler on the same trace
    .venv/bin/python bench/fleet_sim.py --trace ../shared/traces/azure-llm-2023-conv.csv --time-scale 0.25
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# bench/engine_sim.py would shadow the engine_sim package: put the repository root first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulate import cli  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--trace" or a.startswith("--trace=") for a in args):
        args = ["--trace", "synthetic", *args]
    if not any(a == "--compare" or a.startswith("--compare=") for a in args):
        args = ["--compare", "seed", *args]
    parser = argparse.ArgumentParser(prog="fleet_sim.py", description=__doc__.splitlines()[0])
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(args))


if __name__ == "__main__":
    raise SystemExit(main())
