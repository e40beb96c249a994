"""Validate timing: a request fits what the load balancer and a pod's shutdown give it.

* On aws, with TLS ending on the NLB, the listener's idle timeout is fixed at 350 s
  (`fleet.protocol.marks.NLB_TLS_IDLE_TIMEOUT_S`): a non-streamed response is silent until it is complete, and a
  streamed
  one until its first token, so ``timeouts.totalS`` and ``timeouts.firstTokenS`` stay below it, with a margin.
* On aws the NLB keeps sending new connections to a deregistering target for about 120 s
  (`fleet.protocol.marks.NLB_DEREGISTRATION_S`): the gateway's preStop (``drain.propagationSeconds``) waits at least
  that.
* A real engine's drain gives in-flight requests (vLLM's ``--shutdown-timeout``) at least the longest request the
  gateway allows (``timeouts.totalS``), unless the pool resumes interrupted streams on another replica.
* On aws a public TLS gateway names the host its certificate covers (``gateway.hostname``); the load
  balancer's own DNS name is not in the certificate.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from fleet.protocol.marks import NLB_DEREGISTRATION_S, NLB_TLS_IDLE_TIMEOUT_S
from fleet.spec.errors import Problem, key_error as _err, key_warning as _warn
from fleet.spec.stack import DRAIN_MARGIN_S, FleetSpec

__all__ = ["NLB_IDLE_MARGIN_S", "check_timing", "longest_request_s", "tls_on_load_balancer"]

NLB_IDLE_MARGIN_S = 10.0  # a response must start this long before the listener's idle timeout


def tls_on_load_balancer(spec: FleetSpec) -> bool:
    """Whether the gateway's listener is the NLB's TLS listener (aws with an ACM certificate)."""
    return spec.target == "aws" and spec.gateway.tls.certificate_arn is not None


def longest_request_s(spec: FleetSpec) -> int:
    """The longest request the gateway lets run (its ``timeouts.totalS``, whole seconds)."""
    return math.ceil(spec.gateway.timeouts.total_s)


def check_timing(spec: FleetSpec) -> list[Problem]:
    """The listener, preStop and drain checks of the module docstring."""
    return [*_check_listener(spec), *_check_gateway_prestop(spec), *_check_pool_drains(spec)]


def _check_listener(spec: FleetSpec) -> Iterator[Problem]:
    if not tls_on_load_balancer(spec):
        return
    timeouts = spec.gateway.timeouts
    limit = NLB_TLS_IDLE_TIMEOUT_S - NLB_IDLE_MARGIN_S
    why = (
        f"the NLB's TLS listener closes a connection idle for {NLB_TLS_IDLE_TIMEOUT_S} s and its idle timeout "
        "cannot be changed"
    )
    if timeouts.total_s > limit:
        yield _err(
            "gateway.timeouts.totalS",
            f"at most {limit:g} on aws with TLS on the load balancer: {why}, and a non-streamed response sends "
            "nothing until it is complete (longer generations: stream them)",
            timeouts.total_s,
        )
    if timeouts.first_token_s > limit:
        yield _err(
            "gateway.timeouts.firstTokenS",
            f"at most {limit:g} on aws with TLS on the load balancer: {why}",
            timeouts.first_token_s,
        )
    if spec.gateway.public and spec.gateway.hostname is None:
        yield _warn(
            "gateway.hostname",
            "unset: the gatewayUrl output is the load balancer's DNS name, which the certificate does not name, "
            "so clients fail TLS verification; set the host name the certificate covers and point it at the "
            "gatewayLoadBalancer output",
        )


def _check_gateway_prestop(spec: FleetSpec) -> Iterator[Problem]:
    drain = spec.gateway.drain
    if spec.target == "aws" and drain.propagation_seconds < NLB_DEREGISTRATION_S:
        yield _err(
            "gateway.drain.propagationSeconds",
            f"at least {NLB_DEREGISTRATION_S} on aws: an NLB keeps sending new connections to a deregistering pod "
            "for about two minutes, so a gateway that stops listening sooner resets them",
            drain.propagation_seconds,
        )


def _check_pool_drains(spec: FleetSpec) -> Iterator[Problem]:
    if spec.target == "local":
        return
    longest = longest_request_s(spec)
    for index, pool in enumerate(spec.pools):
        if pool.engine.kind == "sim" or pool.resume_streams:
            continue  # a simulator serves no real tokens; resumed streams continue on another replica
        if pool.drain.engine_shutdown_timeout < longest:
            need = math.ceil(longest + pool.drain.propagation_seconds + DRAIN_MARGIN_S)
            yield _err(
                f"pools[{index}].drain.graceSeconds",
                f"in-flight requests get {pool.drain.engine_shutdown_timeout} s when an engine drains (grace - "
                f"propagation - {DRAIN_MARGIN_S:g} s) but the gateway lets a request run {longest} s "
                f"(gateway.timeouts.totalS): set at least {need}, or resumeStreams: true",
                pool.drain.grace_seconds,
            )
