"""Validation of what the load balancer and a pod's shutdown allow a request (`fleet.spec.validate_timing`)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.spec.gateway import GatewaySpec
from fleet.spec.loader import parse_spec
from llmfleet.registries import all_registries
from tests.support.stacks import DELETE, assert_refused, stack_document


def _warnings(**overrides: Any) -> list[str]:
    loaded = parse_spec(stack_document("aws", **overrides), name="aws", registries=all_registries())
    return [p.path for p in loaded.warnings]


@pytest.mark.parametrize(
    ("overrides", "path", "allowed"),
    [
        # The NLB's TLS listener cuts a connection idle for 350 s: a 600 s non-streamed request would be cut.
        ({"gateway.timeouts.totalS": 600}, "gateway.timeouts.totalS", "at most 340"),
        ({"gateway.timeouts.firstTokenS": 345}, "gateway.timeouts.firstTokenS", "at most 340"),
        # The NLB keeps routing new connections to a deregistering pod for about two minutes.
        ({"gateway.drain": {"graceSeconds": 345, "propagationSeconds": 10}}, "gateway.drain.propagationSeconds", "120"),
        # A vLLM pool whose drain gives in-flight requests 105 s while the gateway allows 330 s.
        ({"pools.0.drain": {"graceSeconds": 120, "propagationSeconds": 10}}, "pools.0.drain.graceSeconds", "345"),
    ],
)
def test_aws_stacks_whose_timing_cuts_requests_are_refused(overrides: dict[str, Any], path: str, allowed: str) -> None:
    assert_refused(stack_document("aws", **overrides), "Pulumi.aws.yaml", path.replace(".0.", "[0]."), allowed)


def test_the_aws_preset_passes_and_names_its_host() -> None:
    assert "llmfleet:gateway.hostname" not in _warnings()


def test_a_tls_gateway_without_a_host_name_is_warned_about() -> None:
    assert "llmfleet:gateway.hostname" in _warnings(**{"gateway.hostname": DELETE})


@pytest.mark.parametrize(
    "overrides",
    [
        {"pools.0.drain": {"graceSeconds": 120, "propagationSeconds": 10}, "pools.0.resumeStreams": True},
        # Without TLS on the NLB (a private gateway on a TCP listener) the idle timeout is set above totalS.
        {"gateway.public": False, "gateway.tls": {}, "gateway.timeouts.totalS": 600, "pools.0.drain.graceSeconds": 615},
    ],
)
def test_resumed_streams_or_a_tcp_listener_lift_the_limits(overrides: dict[str, Any]) -> None:
    parse_spec(stack_document("aws", **overrides), name="aws", registries=all_registries())


def test_the_gateway_drain_default_covers_the_nlb_deregistration_and_the_longest_request() -> None:
    drain = GatewaySpec().drain
    assert drain.propagation_seconds >= 120
    assert drain.shutdown_timeout >= GatewaySpec().timeouts.total_s
