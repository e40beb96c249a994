"""EndpointSet: outlier ejection with growing backoff, bounded to a fraction of the pool; what a lease counts."""

from __future__ import annotations

import pytest

from gateway.endpoints import EndpointSet, OutlierPolicy
from gateway.metrics import GatewayMetrics
from gateway.outcome import Outcome
from gateway.upstream import Attempt
from tests.gateway.builders import ManualClock
from tests.support import stacks


def _set(size: int, clock: ManualClock) -> EndpointSet:
    spec = stacks.spec("gateway")
    endpoints = EndpointSet(spec.pools, clock, OutlierPolicy(consecutive_failures=3, base_s=5, max_s=40))
    endpoints.set_members("qwen-7b", [(f"r{i}", f"http://r{i}", True) for i in range(size)])
    return endpoints


def test_consecutive_failures_eject_with_growing_backoff() -> None:
    clock = ManualClock(100.0)
    endpoints = _set(3, clock)
    ep = endpoints.get("qwen-7b", "r0")
    assert ep is not None
    assert [endpoints.failed(ep) for _ in range(3)] == [False, False, True]
    assert endpoints.routable("qwen-7b") == 2
    backoffs = []
    for _ in range(4):
        backoffs.append(ep.ejected_until - clock.now)
        clock.now = ep.ejected_until
        endpoints.failed(ep, eject_now=True)
    assert backoffs == [5, 10, 20, 40]
    clock.now = ep.ejected_until
    endpoints.succeeded(ep)
    assert endpoints.routable("qwen-7b") == 3


@pytest.mark.parametrize(("size", "max_ejected"), [(1, 0), (2, 1), (3, 1), (4, 2), (10, 5)])
def test_at_most_half_the_pool_is_ejected(size: int, max_ejected: int) -> None:
    endpoints = _set(size, ManualClock(100.0))
    ejected = sum(endpoints.failed(ep, eject_now=True) for ep in endpoints.members("qwen-7b"))
    assert ejected == max_ejected


def test_a_lease_counts_one_request_on_the_picked_replica_until_it_ends() -> None:
    endpoints = _set(2, ManualClock(100.0))
    picked = endpoints.snapshot("qwen-7b")[1]
    with endpoints.lease(picked) as ep, endpoints.lease(picked):
        assert ep.id == picked.id
        assert [v.in_flight for v in endpoints.snapshot("qwen-7b")] == [0, 2]
    with pytest.raises(RuntimeError), endpoints.lease(picked):
        raise RuntimeError("the attempt failed")
    assert [v.in_flight for v in endpoints.snapshot("qwen-7b")] == [0, 0]


def test_find_names_a_replica_in_whichever_pool_it_belongs_to() -> None:
    endpoints = _set(2, ManualClock())
    endpoints.set_members("small", [("s-0", "http://s0", True)])
    found = endpoints.find("s-0")
    assert found is not None and found.pool == "small" and found.url == "http://s0"
    first = endpoints.find("r0")
    assert first is not None and first.pool == "qwen-7b"
    assert endpoints.find("nobody") is None


@pytest.mark.parametrize("answered", [False, True])
def test_an_attempt_counts_its_uncached_prompt_until_answered_then_its_context_until_it_ends(answered: bool) -> None:
    endpoints = _set(2, ManualClock(100.0))
    picked = endpoints.snapshot("qwen-7b")[0]
    pool = stacks.spec("gateway").pools[0]
    out, metrics = Outcome("req-1", received=100.0), GatewayMetrics()
    metrics.watch_endpoints(endpoints)

    def exported() -> tuple[float | None, ...]:
        labels = {"pool": "qwen-7b", "replica": picked.id}
        names = ("llmfleet_gateway_prefill_tokens", "llmfleet_gateway_context_tokens")
        return tuple(metrics.registry.get_sample_value(name, labels) for name in names)

    with Attempt(endpoints.lease(picked), metrics, ManualClock(100.0), pool, out, 4000, 0.75) as attempt:
        assert [(v.prefill_tokens, v.context_tokens) for v in endpoints.snapshot("qwen-7b")] == [(1000, 0), (0, 0)]
        assert exported() == (1000, 0)
        if answered:
            attempt.answered()
            attempt.answered()  # a second call changes nothing
            assert (endpoints.snapshot("qwen-7b")[0].prefill_tokens, attempt.ep.context_tokens) == (0, 4000)
            assert exported() == (0, 4000)
    assert [(v.prefill_tokens, v.context_tokens) for v in endpoints.snapshot("qwen-7b")] == [(0, 0), (0, 0)]
    assert exported() == (0, 0)
