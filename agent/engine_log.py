"""Engine log: the start phases an engine reports in its own log lines, read one line at a time (pure).

vLLM times its own start and logs each phase once. The wording below is vLLM's, from the files named beside each
pattern (docs/agent.md cites them); the simulator prints the same lines (`engine_sim.startup`):

* ``load``    -- ``Model loading took %s GiB memory and %.6f seconds`` (the model runner: building the model and
  loading its weights into GPU memory; older releases printed ``%.4f GiB and``), else ``Loading weights took %.2f
  seconds`` (the default loader: the weights alone, printed just before).
* ``compile`` -- ``torch.compile took %.2f s in total`` (Dynamo and Inductor; ``takes`` before vLLM 0.32), else the
  ``(compilation: %.2f s)`` of ``init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f
  s)`` (the same figure). vLLM on CPU logs neither (it compiles in its ``DYNAMO_TRACE_ONCE`` mode, which vLLM's
  compile monitor does not time), only ``Warming up model for the compilation...`` and ``Warming up done.`` around
  the warm-up run that compiles: those two lines are `PhaseMark`s, and the reader times the phase from the first
  line's arrival to the second's.
* ``graphs``  -- ``Graph capturing finished in %.0f secs, took %.2f GiB`` (CUDA graph capture; whole seconds).

A pattern is searched anywhere in the line, so whatever vLLM puts before the message (``INFO 12-25 04:54:03
[gpu_model_runner.py:4587]``, the ``VLLM_LOGGING_PREFIX``, a worker's ``(EngineCore_DP0 pid=79)``, colour codes)
does not matter. Lines without ``took``/``takes``/``Warming up`` are skipped before any regex runs: most lines cost
a few substring tests. Each pattern has a rank: a line of a higher rank replaces what a lower one said of the same
phase, and lines of the same rank keep the largest figure (tensor-parallel workers each log their own; the slowest
one is the phase). The CPU warm-up's marks rank lowest: any figure vLLM logs itself wins.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = ["MARKS", "PATTERNS", "PhaseLine", "PhaseMark", "StartPhase", "parse_line"]


class StartPhase(enum.Enum):
    """A phase of one engine start; the value is the ``phase`` label of ``llmfleet_agent_start_phase_seconds``."""

    FETCH = "fetch"
    LOAD = "load"
    COMPILE = "compile"
    GRAPHS = "graphs"
    READY = "ready"


@dataclass(frozen=True)
class PhaseLine:
    """What one log line says: ``phase`` took ``seconds``; ``rank`` orders lines about the same phase."""

    phase: StartPhase
    seconds: float
    rank: int


@dataclass(frozen=True)
class PhaseMark:
    """A line that opens (``begins``) or closes a phase the engine does not time itself: whoever reads the lines
    times it, from the opening line's arrival to the closing one's."""

    phase: StartPhase
    begins: bool
    rank: int


_NUM = r"(\d+(?:\.\d+)?)"

# (phase, rank, pattern); the group is the phase's seconds.
PATTERNS: tuple[tuple[StartPhase, int, re.Pattern[str]], ...] = (
    # vllm/v1/worker/gpu_model_runner.py and vllm/v1/worker/gpu/model_runner.py, load_model
    (StartPhase.LOAD, 2, re.compile(rf"\bModel loading took [\d.]+ GiB(?: memory)? and {_NUM} seconds\b")),
    # vllm/model_executor/model_loader/default_loader.py, DefaultModelLoader.load_weights
    (StartPhase.LOAD, 1, re.compile(rf"\bLoading weights took {_NUM} seconds\b")),
    # vllm/compilation/monitor.py, monitor_torch_compile (0.32: "took"; before, end_monitoring_torch_compile: "takes")
    (StartPhase.COMPILE, 2, re.compile(rf"\btorch\.compile (?:took|takes) {_NUM} s in total\b")),
    # vllm/v1/engine/core.py, EngineCore._initialize_kv_caches
    (
        StartPhase.COMPILE,
        1,
        re.compile(rf"\binit engine \(profile, create kv cache, warmup model\) took [\d.]+ s \(compilation: {_NUM} s"),
    ),
    # vllm/v1/worker/gpu_model_runner.py, capture_model
    (StartPhase.GRAPHS, 2, re.compile(rf"\bGraph capturing finished in {_NUM} secs, took [\d.]+ GiB\b")),
)


# (phase, rank, begins, pattern): lines around a phase the engine does not time.
MARKS: tuple[tuple[StartPhase, int, bool, re.Pattern[str]], ...] = (
    # vllm/v1/worker/cpu_model_runner.py and vllm/v1/worker/cpu/model_runner.py, CPUModelRunner.warming_up_model
    (StartPhase.COMPILE, 0, True, re.compile(r"\bWarming up model for the compilation\.\.\.")),
    (StartPhase.COMPILE, 0, False, re.compile(r"\bWarming up done\.")),
)


def parse_line(line: str) -> PhaseLine | PhaseMark | None:
    """The phase ``line`` reports, or the phase it opens or closes, or None (most lines: they fail the substring
    tests and no regex runs)."""
    if "took" in line or "takes" in line:
        for phase, rank, pattern in PATTERNS:
            match = pattern.search(line)
            if match is not None:
                return PhaseLine(phase, float(match.group(1)), rank)
    if "Warming up" in line:
        for phase, rank, begins, pattern in MARKS:
            if pattern.search(line) is not None:
                return PhaseMark(phase, begins, rank)
    return None
