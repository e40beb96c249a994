"""The start recorder: which start a phase belongs to, which line wins, and what the gauge shows."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from agent.starts import StartRecorder

LOAD_LINE = "INFO 12-25 04:53:12 [gpu_model_runner.py:3549] Model loading took 14.99 GiB memory and 5.25 seconds"
WEIGHTS_LINE = "INFO 12-25 04:53:11 [default_loader.py:291] Loading weights took 3.86 seconds"
COMPILE_LINE = "INFO 06-05 09:08:04 [monitor.py:33] torch.compile takes 8.69 s in total"
INIT_LINE = (
    "INFO 12-25 04:54:03 [core.py:259] init engine (profile, create kv cache, warmup model) took 30.00 s "
    "(compilation: 8.00 s)"
)
GRAPHS_LINE = "INFO 12-25 04:54:03 [gpu_model_runner.py:4587] Graph capturing finished in 9 secs, took 0.66 GiB"


def _recorder() -> tuple[StartRecorder, CollectorRegistry]:
    registry = CollectorRegistry()
    return StartRecorder(Gauge("start_phase_seconds", "test", ["phase"], registry=registry)), registry


def _gauge(registry: CollectorRegistry) -> dict[str, float]:
    return {s.labels["phase"]: s.value for metric in registry.collect() for s in metric.samples if "phase" in s.labels}


def test_nothing_is_reported_before_the_first_start() -> None:
    recorder, registry = _recorder()
    assert recorder.info() is None and _gauge(registry) == {}


def test_a_fetched_start_has_every_phase_and_ready_counts_from_the_launch() -> None:
    recorder, registry = _recorder()
    recorder.fetch_began(now=100.0, wall=1_700_000_000.0)
    recorder.fetch_done(now=112.5)
    sink = recorder.launched(now=113.0, wall=1_700_000_013.0)
    for line in (WEIGHTS_LINE, LOAD_LINE, COMPILE_LINE, GRAPHS_LINE, INIT_LINE):
        sink(line)
    recorder.healthy(now=140.0)
    info = recorder.info()
    assert info is not None
    assert info.started_at == 1_700_000_000.0  # the fetch began the start
    assert (info.fetch_s, info.load_s, info.compile_s, info.graphs_s, info.ready_s) == (12.5, 5.25, 8.69, 9.0, 27.0)
    assert _gauge(registry) == {"fetch": 12.5, "load": 5.25, "compile": 8.69, "graphs": 9.0, "ready": 27.0}


def test_a_lower_ranked_line_never_replaces_a_higher_one_and_fills_a_gap() -> None:
    recorder, _ = _recorder()
    sink = recorder.launched(now=0.0, wall=0.0)
    sink(LOAD_LINE)
    sink(WEIGHTS_LINE)  # printed before the model runner's line in vLLM; arriving after, it still loses
    sink(INIT_LINE)  # no torch.compile line (a warm cache still logs it; this checks the fallback)
    info = recorder.info()
    assert info is not None and (info.load_s, info.compile_s) == (5.25, 8.0)


WARM_UP_BEGINS = "INFO 12-05 23:31:26 [cpu_model_runner.py:87] Warming up model for the compilation..."
WARM_UP_DONE = "INFO 12-05 23:31:40 [cpu_model_runner.py:91] Warming up done."
CPU_INIT_LINE = "INFO 12-05 23:31:41 [core.py:403] init engine (profile, create kv cache, warmup model) took 14.42 s"


class Clock:
    """The recorder's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_vllm_on_cpu_has_its_compiling_warm_up_timed_between_its_two_lines_as_compile() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    recorder = StartRecorder(Gauge("start_phase_seconds", "test", ["phase"], registry=registry), clock)
    sink = recorder.launched(now=0.0, wall=0.0)
    clock.now = 40.0
    sink(WEIGHTS_LINE)
    sink(WARM_UP_BEGINS)
    clock.now = 52.5
    sink(WARM_UP_DONE)
    sink(CPU_INIT_LINE)
    info = recorder.info()
    assert info is not None and (info.load_s, info.compile_s, info.graphs_s) == (3.86, 12.5, None)
    assert _gauge(registry) == {"load": 3.86, "compile": 12.5}


def test_a_compile_figure_the_engine_logs_wins_over_the_timed_warm_up() -> None:
    clock = Clock()
    recorder = StartRecorder(Gauge("start_phase_seconds", "test", ["phase"], registry=CollectorRegistry()), clock)
    sink = recorder.launched(now=0.0, wall=0.0)
    sink(COMPILE_LINE)
    sink(WARM_UP_BEGINS)
    clock.now = 30.0
    sink(WARM_UP_DONE)
    sink(WARM_UP_DONE)  # a closing line without its opening one times nothing
    info = recorder.info()
    assert info is not None and info.compile_s == 8.69


def test_tensor_parallel_workers_lines_keep_the_slowest() -> None:
    recorder, _ = _recorder()
    sink = recorder.launched(now=0.0, wall=0.0)
    sink(GRAPHS_LINE.replace("in 9 secs", "in 11 secs"))
    sink(GRAPHS_LINE)
    info = recorder.info()
    assert info is not None and info.graphs_s == 11.0


def test_a_restart_without_a_fetch_is_a_new_start_and_clears_the_gauge() -> None:
    recorder, registry = _recorder()
    recorder.fetch_began(now=0.0, wall=10.0)
    recorder.fetch_done(now=5.0)
    first = recorder.launched(now=5.0, wall=15.0)
    first(LOAD_LINE)
    recorder.healthy(now=20.0)
    second = recorder.launched(now=50.0, wall=60.0)
    first(COMPILE_LINE)  # the old engine's last words belong to the old start
    info = recorder.info()
    assert info is not None
    assert info.started_at == 60.0 and info.fetch_s is None and info.load_s is None and info.compile_s is None
    assert info.ready_s is None and _gauge(registry) == {}
    second(GRAPHS_LINE)
    recorder.healthy(now=62.0)
    recorder.healthy(now=90.0)  # only the first healthy answer after a launch counts
    info = recorder.info()
    assert info is not None and (info.graphs_s, info.ready_s) == (9.0, 12.0)


def test_a_failed_fetch_leaves_its_start_without_fetch_time_and_the_retry_begins_anew() -> None:
    recorder, _ = _recorder()
    recorder.fetch_began(now=0.0, wall=100.0)
    recorder.fetch_began(now=30.0, wall=130.0)  # the first fetch failed; this is the retry
    recorder.fetch_done(now=31.0)
    recorder.launched(now=31.0, wall=131.0)
    info = recorder.info()
    assert info is not None and (info.started_at, info.fetch_s) == (130.0, 1.0)
