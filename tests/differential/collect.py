"""Collect: everything the suite asks one engine, in order, as named `Exchange` values.

The same functions run against the real engine and the simulator, so the two answer the same questions in the
same order: the readiness seen during the start, the first KV-event batch for a 3-block prompt, the corpus,
``/metrics`` after it, sleep and wake, a SIGTERM with long streams in flight (which ends the engine), and, on a
second engine, a SIGTERM while it starts.
"""

from __future__ import annotations

import os
import signal
import threading

import httpx
import zmq

from tests.differential.corpus import CORPUS, MODEL, PROMPT, Probe
from tests.differential.engines import KEY, Engine, wait_ready
from tests.differential.exchange import Exchange, parse_sse, send
from tests.differential.surfaces import kv_frame, metrics_exchange
from tests.support.wait import wait_for

__all__ = ["Answers", "collect_all", "collect_sigterm", "collect_sigterm_while_starting"]

Answers = dict[str, Exchange]

SLEEP = (("is_sleeping before", "GET", "/is_sleeping"), ("sleep level 1", "POST", "/sleep?level=1"),
         ("is_sleeping asleep", "GET", "/is_sleeping"), ("wake up", "POST", "/wake_up"),
         ("is_sleeping awake", "GET", "/is_sleeping"))  # fmt: skip
LONG = 1800  # tokens of each stream in flight at SIGTERM
STREAMS = 4  # together about five seconds of decoding on either engine: the drain outlasts the probes made in it


def collect_all(engine: Engine) -> Answers:
    """Every exchange but the SIGTERM's, in order (the engine keeps serving)."""
    readiness = Exchange("readiness during start", 0, "", "json", engine.ready_states)
    answers: Answers = {readiness.probe: readiness}
    answers["kv events"] = _kv_events(engine)
    with httpx.Client(timeout=120) as client:
        for probe in CORPUS:
            answers[probe.name] = send(client, engine.url, probe, answers, KEY)
        answers["metrics"] = metrics_exchange(client.get(engine.url + "/metrics").text)
        for name, method, path in SLEEP:
            answers[name] = send(client, engine.url, Probe(name, method, path), {}, KEY)
    return answers


def _kv_events(engine: Engine) -> Exchange:
    """The first batch the engine publishes, for the first request it serves (a prompt of three full blocks), read
    back from its replay socket from sequence number 0: no subscription that could miss it."""
    body = {"model": MODEL, "prompt": PROMPT * 40, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    answer = httpx.post(engine.url + "/v1/completions", json=body, headers={"authorization": f"Bearer {KEY}"},
                        timeout=120)  # fmt: skip
    assert answer.status_code == 200, answer.text
    frames = wait_for(lambda: _replayed(engine), timeout_s=10, what=f"{engine.name}'s first KV-event batch")
    return Exchange("kv events", 0, "", "json", kv_frame(frames))


def _replayed(engine: Engine) -> list[bytes] | None:
    """The replay's first reply from sequence number 0 as ``[topic, seq, payload]``; None while it holds none."""
    with zmq.Context.instance().socket(zmq.DEALER) as replay:
        replay.setsockopt(zmq.LINGER, 0)
        replay.connect(engine.replay)
        replay.send_multipart([b"", (0).to_bytes(8, "big")])
        if not replay.poll(2000):
            return None
        _, *frames = replay.recv_multipart()
    return frames if frames[-1] else None  # the end marker's payload is empty: nothing published yet


def collect_sigterm(engine: Engine) -> Answers:
    """SIGTERM with long streams in flight: the first stream's end, a new request and ``/health`` during the
    drain, and the exit code. The engine is gone afterwards.

    The drain lasts as long as its streams: `STREAMS` of `LONG` tokens keep either engine busy for seconds after
    the SIGTERM, so the probes made during it (the first refused request, then ``/health`` at once) never race
    the engine's exit."""
    long = {"model": MODEL, "prompt": PROMPT, "max_tokens": LONG, "stream": True, "ignore_eos": True}
    stream = Probe("stream in flight at SIGTERM", "POST", "/v1/completions", long)
    late = Probe("new request while draining", "POST", "/v1/completions",
                 {"model": MODEL, "prompt": PROMPT, "max_tokens": 4})  # fmt: skip
    health = Probe("health while draining", "GET", "/health", auth=False)
    answers: Answers = {}
    streaming = [threading.Event() for _ in range(STREAMS)]
    readers = [
        threading.Thread(target=_read, args=(engine, stream, answers, i, streaming[i]), daemon=True)
        for i in range(STREAMS)
    ]
    for reader in readers:
        reader.start()
    # Each stream's first chunk says it runs (a CPU engine busy streaming answers /metrics seconds late).
    for event in streaming:
        assert event.wait(30), f"{engine.name}: a long stream sent no chunk within 30 s"
    os.kill(engine.child.process.pid, signal.SIGTERM)
    refused = wait_for(lambda: _refused(engine, late), timeout_s=10, what=f"{engine.name} draining")
    answers[late.name] = refused
    with httpx.Client(timeout=10) as client:
        answers[health.name] = send(client, engine.url, health, {}, KEY)
    for reader in readers:
        reader.join(60)
    code = engine.child.process.wait(timeout=60)
    answers["exit code"] = Exchange("exit code", 0, "", "json", code)
    return answers


def _read(engine: Engine, stream: Probe, answers: Answers, index: int, streaming: threading.Event) -> None:
    """Stream ``stream`` to its end, setting ``streaming`` at its first chunk; the first reader's is the answer."""
    lines: list[str] = []
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", engine.url + stream.path, json=stream.body, headers={"authorization": f"Bearer {KEY}"}
        ) as response,
    ):
        for line in response.iter_lines():
            lines.append(line)
            streaming.set()
        status, media = response.status_code, response.headers.get("content-type", "").split(";")[0].strip()
    streaming.set()
    if index == 0:  # the others only keep the engine draining
        answers[stream.name] = Exchange(stream.name, status, media, "sse", parse_sse("\n".join(lines)))


def _refused(engine: Engine, probe: Probe) -> Exchange | None:
    """The engine's answer to a new request once it refuses them (its SIGTERM handler has run); None before."""
    with httpx.Client(timeout=10) as client:
        answer = send(client, engine.url, probe, {}, KEY)
    return answer if answer.status != 200 else None


WARMING_UP = "Warming up model for the compilation"  # the CPU build's warm-up line (the simulator's too)


def collect_sigterm_while_starting(engine: Engine, timeout_s: float) -> Answers:
    """A SIGTERM sent while the (just launched) engine warms up: whether it goes on to serve, and the exit code
    after a second SIGTERM once it does (or its own, when the first ended it). The engine is gone afterwards."""
    wait_for(
        lambda: WARMING_UP in engine.child.log.read_text(errors="replace") or None,
        timeout_s=timeout_s,
        what=f"{engine.name} warming up",
        diagnostics=lambda: engine.child.tail(20),
    )
    os.kill(engine.child.process.pid, signal.SIGTERM)
    try:
        wait_ready(engine, timeout_s)
        served = True
    except AssertionError:  # it exited (or never served): the start ended
        served = False
    if served:
        os.kill(engine.child.process.pid, signal.SIGTERM)
    code = engine.child.process.wait(timeout=60)
    found = {"serves after a SIGTERM while starting": served, "exit code after a SIGTERM while starting": code}
    return {name: Exchange(name, 0, "", "json", value) for name, value in found.items()}
