"""The differential suite: the simulator answers as vLLM does, shown by sending both the same requests.

A real ``vllm serve`` (the CPU build) and ``llmfleet sim serve`` start with the same flags
(`tests.differential.engines`) and answer the same questions (`tests.differential.collect`: readiness during the
start, KV events, the corpus of every route the gateway uses or relays and its error cases, ``/metrics``, sleep and
wake, SIGTERM under load, and SIGTERM while starting on a second engine of each). Every difference
(`tests.differential.compare`) must be one the simulator documents (`tests.differential.known`): a new one fails
the suite, and so does a listed one that no longer occurs.

The real engine's answers are written to ``.build/differential/real.json``, so the simulator can be compared with
them again in seconds, without vLLM (``python -m tests.differential.replay``). ``LLMFLEET_WRITE_DIFFERENTIAL=1``
rewrites the list in docs/engine-simulator.md from the run; otherwise the last test checks the list is the run's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from tests.differential.collect import Answers, collect_all, collect_sigterm, collect_sigterm_while_starting
from tests.differential.compare import Difference, compare
from tests.differential.engines import Engine, launch_real, launch_sim, start_real, start_sim
from tests.differential.known import DOCS, REAL_ANSWERS, check, documented_keys, render_section, update_docs
from tests.support.procs import Procs
from tests.vllm.conftest import START_S


@pytest.fixture(scope="module")
def engines(module_procs: Procs) -> Iterator[tuple[Engine, Engine]]:
    """The simulator, then the real engine (one start at a time); both stopped after the module."""
    started: list[Engine] = []
    try:
        started.append(start_sim(module_procs.folder, timeout_s=60))
        started.append(start_real(module_procs.folder, timeout_s=START_S))
        yield started[1], started[0]
    finally:
        for engine in started:
            engine.child.stop(timeout_s=30)


@pytest.fixture(scope="module")
def answers() -> dict[str, Answers]:
    return {"vllm": {}, "sim": {}}


def test_both_engines_answer_every_probe(engines: tuple[Engine, Engine], answers: dict[str, Answers]) -> None:
    for engine in engines:
        answers[engine.name].update(collect_all(engine))
    assert answers["vllm"].keys() == answers["sim"].keys()


def test_both_engines_drain_on_sigterm(engines: tuple[Engine, Engine], answers: dict[str, Answers]) -> None:
    for engine in engines:
        answers[engine.name].update(collect_sigterm(engine))
    assert answers["vllm"]["exit code"].body == 0, "vLLM exits 0 after a drain"


def test_both_engines_answer_a_sigterm_while_starting_alike(module_procs: Procs, answers: dict[str, Answers]) -> None:
    """A second engine of each kind, one at a time, SIGTERMed while it warms up."""
    for launch, timeout_s in ((launch_sim, 60.0), (launch_real, START_S)):
        engine = launch(module_procs.folder, f"{launch.__name__[7:]}-2")
        try:
            answers["vllm" if launch is launch_real else "sim"].update(
                collect_sigterm_while_starting(engine, timeout_s)
            )
        finally:
            engine.child.stop(timeout_s=10)


def test_every_difference_is_listed(answers: dict[str, Answers]) -> None:
    """The run's differences are exactly those the simulator documents, and the docs list is this run's."""
    real, sim = answers["vllm"], answers["sim"]
    assert real.keys() == sim.keys(), "both engines must have answered every question (an earlier test failed?)"
    REAL_ANSWERS.parent.mkdir(parents=True, exist_ok=True)
    REAL_ANSWERS.write_text(json.dumps({k: v.to_json() for k, v in real.items()}, indent=1))
    found: list[Difference] = [d for name in real for d in compare(real[name], sim[name])]
    if os.environ.get("LLMFLEET_WRITE_DIFFERENTIAL") == "1":
        update_docs(DOCS, render_section(found))
    problems = check(found)
    assert not problems, "\n".join(problems)
    assert documented_keys(DOCS.read_text()) == [d.key for d in found], (
        "docs/engine-simulator.md's list is not this run's: run the suite with LLMFLEET_WRITE_DIFFERENTIAL=1"
    )
