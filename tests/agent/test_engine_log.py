"""The engine log parser on vLLM's own start lines: each pattern, a line that trips it and a near miss that does not."""

from __future__ import annotations

import pytest

from agent.engine_log import MARKS, PATTERNS, PhaseLine, PhaseMark, StartPhase, parse_line

LOAD, COMPILE, GRAPHS = StartPhase.LOAD, StartPhase.COMPILE, StartPhase.GRAPHS

# Lines as vLLM prints them: ``%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s`` (vllm/logger.py),
# with the ``(EngineCore_DP0 pid=N)`` prefix vLLM puts on its engine-core process's output.
TRIPS = [
    (
        "model runner load (0.11+)",
        "(EngineCore_DP0 pid=79) INFO 12-25 04:53:12 [gpu_model_runner.py:3549] Model loading took 14.99 GiB memory "
        "and 5.274188 seconds",
        PhaseLine(LOAD, 5.274188, 2),
    ),
    (
        "model runner load (older: no 'memory')",
        "INFO 06-05 09:07:52 [gpu_model_runner.py:1329] Model loading took 15.2208 GiB and 4.512392 seconds",
        PhaseLine(LOAD, 4.512392, 2),
    ),
    (
        "default loader weights",
        "(EngineCore_DP0 pid=79) INFO 12-25 04:53:11 [default_loader.py:291] Loading weights took 3.86 seconds",
        PhaseLine(LOAD, 3.86, 1),
    ),
    (
        "torch.compile total",
        "INFO 06-05 09:08:04 [monitor.py:33] torch.compile takes 8.69 s in total",
        PhaseLine(COMPILE, 8.69, 2),
    ),
    (
        "torch.compile total (0.32: took, with a compile tag)",
        "(EngineCore pid=374) INFO 12-05 23:31:40 [monitor.py:62] [backbone] torch.compile took 11.52 s in total",
        PhaseLine(COMPILE, 11.52, 2),
    ),
    (
        "engine init with an encoder's compilation too (0.32)",
        "(EngineCore pid=374) INFO 12-05 23:31:52 [core.py:387] init engine (profile, create kv cache, warmup model) "
        "took 40.10 s (compilation: 20.00 s — language_model: 15.00 s, encoder: 5.00 s)",
        PhaseLine(COMPILE, 20.0, 1),
    ),
    (
        "engine init with compilation",
        "(EngineCore pid=374) INFO 04-20 04:20:12 [core.py:349] init engine (profile, create kv cache, warmup model) "
        "took 212.68 s (compilation: 13.01 s)",
        PhaseLine(COMPILE, 13.01, 1),
    ),
    (
        "graph capture",
        "(EngineCore_DP0 pid=79) INFO 12-25 04:54:03 [gpu_model_runner.py:4587] Graph capturing finished in 9 secs, "
        "took 0.66 GiB",
        PhaseLine(GRAPHS, 9.0, 2),
    ),
    (
        "colour codes and a logging prefix around the message",
        "\x1b[32mINFO\x1b[0m \x1b[90m12-25 04:54:03 [gpu_model_runner.py:4587]\x1b[0m Graph capturing finished in 31 "
        "secs, took 0.45 GiB",
        PhaseLine(GRAPHS, 31.0, 2),
    ),
]


def _vllm(where: str, message: str) -> str:
    """A line in vLLM's default format, logged at ``where`` (``file.py:line``)."""
    return f"INFO 12-25 04:53:12 [{where}] {message}"


NEAR_MISSES = [
    ("reload, not a load", _vllm("gpu_model_runner.py:3900", "Reloading and processing weights took 3.10 seconds")),
    ("load without its seconds", _vllm("gpu_model_runner.py:3549", "Model loading took 14.99 GiB memory")),
    ("load in another unit", _vllm("default_loader.py:291", "Loading weights took 3.86 minutes")),
    (
        "compile cache load",
        _vllm("backends.py:132", "Directly load the compiled graph(s) for shape None from the cache, took 6.203 s"),
    ),
    ("compile without 'in total'", _vllm("monitor.py:33", "torch.compile takes 8.69 s")),
    (
        "engine init without compilation",
        _vllm("core.py:259", "init engine (profile, create kv cache, warmup model) took 107.64 seconds"),
    ),
    (
        "engine init without compilation (0.32, vLLM on CPU)",
        _vllm("core.py:403", "init engine (profile, create kv cache, warmup model) took 14.42 s"),
    ),
    (
        "compile and first run together: the init line's figure says the same",
        _vllm("monitor.py:62", "torch.compile and initial profiling/warmup run together took 12.40 s in total"),
    ),
    ("profiling run", _vllm("monitor.py:91", "Initial profiling/warmup run took 0.52 s")),
    ("another warm-up", _vllm("kernel_warmup.py:291", "Warming up FlashInfer attention.")),
    ("a kernel warm-up", _vllm("mamba_mixer2.py:622", "Warming up Mamba2 SSD Triton kernels...")),
    ("graph capture progress bar", "Capturing CUDA graphs (decode, FULL): 100%|██████████| 51/51 [00:03<00:00]"),
    ("graph memory estimate", _vllm("gpu_model_runner.py:4300", "Estimated CUDA graph memory: 0.66 GiB total")),
    (
        "the simulator's opening line",
        "INFO 2026-12-02 03:15:33,387 [engine_sim] Loading weights of Qwen/Qwen2.5-7B-Instruct on a simulated "
        "a100-80gb (2.0 s)",
    ),
]


@pytest.mark.parametrize(("line", "expected"), [t[1:] for t in TRIPS], ids=[t[0] for t in TRIPS])
def test_a_vllm_start_line_reports_its_phase_and_seconds(line: str, expected: PhaseLine) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize("line", [m[1] for m in NEAR_MISSES], ids=[m[0] for m in NEAR_MISSES])
def test_a_near_miss_reports_nothing(line: str) -> None:
    assert parse_line(line) is None


def test_every_pattern_has_a_line_that_trips_it() -> None:
    tripped = {
        index
        for _, line, _ in TRIPS
        for index, (_, _, pattern) in enumerate(PATTERNS)
        if pattern.search(line) is not None
    }
    assert tripped == set(range(len(PATTERNS)))


# vLLM on CPU (0.32): the warm-up run that compiles, between two lines without a figure.
MARK_TRIPS = [
    (
        "CPU warm-up begins",
        "(EngineCore pid=2291) INFO 12-05 23:31:26 [cpu_model_runner.py:87] Warming up model for the compilation...",
        PhaseMark(COMPILE, begins=True, rank=0),
    ),
    (
        "CPU warm-up ends",
        "(EngineCore pid=2291) INFO 12-05 23:31:40 [cpu_model_runner.py:91] Warming up done.",
        PhaseMark(COMPILE, begins=False, rank=0),
    ),
]


@pytest.mark.parametrize(("line", "expected"), [t[1:] for t in MARK_TRIPS], ids=[t[0] for t in MARK_TRIPS])
def test_a_cpu_warm_up_line_opens_or_closes_the_compile_phase(line: str, expected: PhaseMark) -> None:
    assert parse_line(line) == expected


def test_every_mark_has_a_line_that_trips_it() -> None:
    tripped = {index for _, line, _ in MARK_TRIPS for index, (*_, pattern) in enumerate(MARKS) if pattern.search(line)}
    assert tripped == set(range(len(MARKS)))


def test_a_figure_vllm_logs_outranks_the_cpu_warm_up_marks() -> None:
    compile_ranks = {rank for phase, rank, _ in PATTERNS if phase is COMPILE}
    assert all(rank < min(compile_ranks) for phase, rank, _, _ in MARKS if phase is COMPILE)


def test_a_line_without_took_or_takes_is_skipped() -> None:
    assert parse_line("INFO 12-25 04:54:04 [api_server.py:1099] Supported tasks: ['generate']") is None
