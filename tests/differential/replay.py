"""Replay: the simulator against the real engine's recorded answers, in seconds and without vLLM.

``python -m tests.differential.replay`` starts ``llmfleet sim serve`` as the suite does, asks it everything, and
compares its answers with ``.build/differential/real.json`` (written by the last run of
``tests/vllm/test_differential.py``); it prints the differences no entry of `tests.differential.known` lists, the
entries nothing matched, and exits 1 when there are any. ``--all`` prints every difference. This is for working on
the simulator; the suite itself always runs both engines.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tests.differential.collect import collect_all, collect_sigterm, collect_sigterm_while_starting
from tests.differential.compare import compare
from tests.differential.engines import launch_sim, start_sim
from tests.differential.exchange import Exchange
from tests.differential.known import REAL_ANSWERS, check, entry_for


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="print every difference, listed or not")
    args = parser.parse_args(argv)
    if not REAL_ANSWERS.exists():
        print(f"{REAL_ANSWERS} is missing: run tests/vllm/test_differential.py once (make test-vllm)", file=sys.stderr)
        return 2
    real = {k: Exchange.from_json(v) for k, v in json.loads(REAL_ANSWERS.read_text()).items()}
    with tempfile.TemporaryDirectory() as folder:
        engine = start_sim(Path(folder), timeout_s=60)
        try:
            sim = {**collect_all(engine), **collect_sigterm(engine)}
        finally:
            engine.child.stop(timeout_s=10)
        second = launch_sim(Path(folder), "sim-2")
        try:
            sim.update(collect_sigterm_while_starting(second, timeout_s=60))
        finally:
            second.child.stop(timeout_s=10)
    found = [d for name in real if name in sim for d in compare(real[name], sim[name])]
    for d in found if args.all else [d for d in found if entry_for(d) is None]:
        print(f"{d.key}: vLLM {d.real!r}, simulator {d.sim!r}")
    problems = check(found)
    print(f"{len(found)} differences, {len(problems)} problems", file=sys.stderr)
    for problem in problems:
        if problem.startswith("listed"):
            print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
