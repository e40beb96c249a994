"""Replay speed: requests `llmfleet simulate` replays per second of this machine, for each shipped trace.

    .venv/bin/python bench/simulate_speed.py                    # the first 300 s of each trace, rate x1
    .venv/bin/python bench/simulate_speed.py --duration 0       # whole traces (minutes)
    .venv/bin/python bench/simulate_speed.py --trace azure-llm-2023-conv.csv --duration 0 --config p2c/fixed
    .venv/bin/python bench/simulate_speed.py --step-by-step     # also without decode runs, side by side

Each trace is replayed with the prod stack's own routing and scaling (or ``--config ROUTING/SCALING``, repeatable)
at seed 7, one configuration at a time in this process, as `simulate.replay.run_config` runs it for the command.
Mooncake runs with ``maxModelLen`` 32768 (its prompts are long), the Azure traces with the stack's own. Printed
per run: requests replayed, wall seconds, CPU seconds of this process, requests per wall and per CPU second,
and the load average (the machine is shared: on a busy one wall time is a multiple of CPU time). ``digest`` is
a hash of the run's whole result (every TTFT and ITL, counters, the scaler's timeline; not the wall time): equal
digests on two revisions mean the replay's figures did not change. ``--step-by-step`` replays each run again
with one event per engine step (no decode runs, `simulate.fleet_sim.FleetSim`), on the line below; its digest is the
same, ITLs being hashed sorted. It prints, it never asserts.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import sys
import time
from dataclasses import asdict
from pathlib import Path

# bench/engine_sim.py would shadow the engine_sim package: put the repository root first.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleet.spec.loader import load_spec  # noqa: E402
from llmfleet.registries import all_registries  # noqa: E402
from simulate.configs import Config, stack_config  # noqa: E402
from simulate.replay import prepare, run_config  # noqa: E402
from simulate.result import Result  # noqa: E402
from simulate.trace import read_trace, scale_trace  # noqa: E402

TRACES = {  # shipped trace -> maxModelLen override (None: the pool's)
    "azure-llm-2023-code.csv": None,
    "azure-llm-2023-conv.csv": None,
    "mooncake-synthetic.jsonl": 32768,
}
SEED = 7


def digest(result: Result) -> str:
    """A hash of everything the run produced except its wall time."""
    fields = asdict(result)
    fields.pop("wall_s")
    fields["itls"] = sorted(result.itls)  # recorded per decode run, not per step: the order is not a figure
    return hashlib.sha256(pickle.dumps(sorted(fields.items()))).hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simulate_speed.py", description=__doc__.splitlines()[0])
    parser.add_argument("--traces-dir", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--trace", action="append", choices=sorted(TRACES), help="default: every shipped trace")
    parser.add_argument("--duration", type=float, default=300.0, help="replay the first S seconds (0: all)")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--stack", default="prod")
    parser.add_argument("--config", action="append", help="ROUTING/SCALING (default: the stack's own)")
    parser.add_argument("--step-by-step", action="store_true", help="also replay without decode runs")
    args = parser.parse_args(argv)
    spec = load_spec(args.stack, registries=all_registries()).spec
    configs = [Config(*c.split("/", 1)) for c in args.config] if args.config else [stack_config(spec)]
    print(
        f"{'trace':<26} {'configuration':<54} {'requests':>8} {'wall s':>7} {'cpu s':>7} "
        f"{'req/wall-s':>10} {'req/cpu-s':>9} {'load':>5}  digest"
    )
    for name in args.trace or sorted(TRACES):
        trace = scale_trace(read_trace(args.traces_dir / name), rate_scale=args.rate_scale, seed=SEED)
        if args.duration > 0:
            trace = [r for r in trace if r.t < args.duration]
        prepared = prepare(args.stack, trace, max_model_len=TRACES[name])
        for config, decode_runs in [(c, d) for c in configs for d in ((True, False) if args.step_by_step else (True,))]:
            wall, cpu = time.perf_counter(), time.process_time()
            result = run_config(prepared, config, SEED, decode_runs=decode_runs)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            n = len(prepared.trace)
            label = config.name if decode_runs else f"{config.name} (step by step)"
            print(
                f"{name:<26} {label:<54} {n:>8} {wall:>7.1f} {cpu:>7.1f} {n / wall:>10.0f} {n / cpu:>9.0f} "
                f"{os.getloadavg()[0]:>5.1f}  {digest(result)}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
