"""engine.kvEvents end to end: a real agent starts the real simulator with vLLM's ``--kv-events-config``, reports
the event socket to a real control plane, and a plain ZMQ subscriber found through discovery receives the blocks
a completion cached, under the replica's topic."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from tests.agent.conftest import AgentProc
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


def test_the_event_socket_travels_in_discovery_and_publishes_the_blocks_a_completion_cached(
    write_stack: Any, start_agent: Any, start_control_plane: Any
) -> None:
    stack = write_stack(**{"pools.0.engine.kvEvents": True})
    cp = start_control_plane(stack)
    agent: AgentProc = start_agent(stack, "r0", cp.url)

    def listed() -> str | None:
        replicas = httpx.get(f"{cp.url}/v1/pools/qwen-7b/replicas", timeout=5).json().get("replicas", [])
        return next((r["last_report"]["kv_events_url"] for r in replicas if r["replica"] == "r0"), None)

    url = wait_for(listed, timeout_s=20, what="r0's event socket in discovery", diagnostics=agent.tail)
    status = agent.status()
    argv = status["engine"]["argv"]
    config = json.loads(argv[argv.index("--kv-events-config") + 1])
    # The engine binds every interface on the port; the report names it at the host others reach the engine on.
    assert config["endpoint"] == "tcp://*:" + url.rsplit(":", 1)[1] and url.startswith("tcp://127.0.0.1:")
    model = status["model"]
    topic = f"kv@r0@{model}".encode()
    with zmq.Context() as context, context.socket(zmq.SUB) as sub:
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, topic)
        sub.connect(url)
        body = {"model": model, "prompt": list(range(64)), "max_tokens": 2}  # four full 16-token blocks

        def batch() -> list[Any] | None:
            # A subscription reaches a publisher some milliseconds after the connect: until then its batches are
            # dropped, so the completion is sent again until one arrives.
            httpx.post(f"{status['engine_url']}/v1/completions", json=body, timeout=10).raise_for_status()
            if not sub.poll(500):
                return None
            got_topic, seq, payload = sub.recv_multipart()
            assert got_topic == topic and len(seq) == 8
            decoded: list[Any] = msgpack.unpackb(payload)
            return decoded

        started = time.monotonic()
        ts, events, *_ = wait_for(batch, timeout_s=20, what="a KV event batch", diagnostics=agent.tail)
    stored = [e for e in events if e["type"] == "BlockStored"]
    assert stored and ts >= started - 60
    assert sum(len(e["block_hashes"]) for e in stored) >= 4
    assert stored[0]["token_ids"][:16] == list(range(16)) and stored[0]["block_size"] == 16
