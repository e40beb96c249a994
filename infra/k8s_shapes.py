"""K8s shapes: the program's plain dict specs handed to pulumi_kubernetes as the TypedDicts it declares.

Pod, Deployment and Service specs are plain dicts (snake_case keys, as pulumi_kubernetes inputs) built by pure
functions (`infra.pools.engine_deployment_spec`, `infra.gateway_tier.gateway_pod_spec`, ...): the tests read
them without Pulumi, and the policy pack reads the same shapes back from the resource graph. pulumi_kubernetes
declares those arguments as nested TypedDicts whose every field is a ``pulumi.Input`` union (value, awaitable
or Output). A ``dict[str, Any]`` never matches a TypedDict, and inferring a nested dict literal against those
unions, overload by overload, takes mypy over 10 GB for one Deployment. `shaped` names the TypedDict a spec
stands for where it meets the resource, so the rest of the call (names, metadata, options) is still checked;
the specs' content is asserted by the graph tests (tests/infra) and the policy pack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

__all__ = ["shaped"]

T = TypeVar("T")


def shaped(value: Mapping[str, Any], shape: type[T]) -> T:
    """``value`` as the pulumi_kubernetes input ``shape`` (a ``*ArgsDict``); the value itself is unchanged."""
    del shape  # Unused at run time: it names the type the resource's argument declares.
    return cast(T, value)
