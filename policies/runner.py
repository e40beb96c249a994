"""Runner: feed resources through the pack's policies without the Pulumi engine, as CrossGuard would.

Resource policies see each custom resource once; stack policies see all of them, components included, each
with its parent and the resources it depends on (as the analyzer gives them: ordering checks follow both, since
a child waits for its parent's registration, which waits for the parent's dependencies). Props are wrapped in
pulumi_policy's unknown-checking proxy like the real analyzer does, config defaults come from each policy's
schema (overridden per policy by ``config``), and a policy's ``enforcementLevel`` may be overridden there too.
A policy that names no level has the pack's (`policies.pack.ENFORCEMENT_LEVEL`), as pulumi_policy's
``PolicyPack`` gives it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import unknown_checking_proxy

from policies.pack import ENFORCEMENT_LEVEL

__all__ = ["Resource", "Violation", "evaluate", "policy_config"]


class Resource(Protocol):
    """What the runner needs of a resource (`infra.offline.RecordedResource` has it)."""

    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def urn(self) -> str: ...
    @property
    def props(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Violation:
    policy: str
    level: str  # "mandatory" | "advisory"
    message: str
    urn: str | None = None
    resource: str | None = None

    @property
    def mandatory(self) -> bool:
        return self.level == EnforcementLevel.MANDATORY.value


def policy_config(policy: Policy, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The policy's config: its schema's defaults, then ``overrides`` (minus ``enforcementLevel``)."""
    config: dict[str, Any] = {}
    if policy.config_schema is not None:
        for key, schema in policy.config_schema.properties.items():
            if "default" in schema:
                config[key] = schema["default"]
    config.update({k: v for k, v in dict(overrides or {}).items() if k != "enforcementLevel"})
    return config


def _level(policy: Policy, overrides: Mapping[str, Any]) -> str:
    level = overrides.get("enforcementLevel") or (policy.enforcement_level or ENFORCEMENT_LEVEL).value
    return str(level)


def _options() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def _run(result: Any) -> None:
    if inspect.isawaitable(result):
        asyncio.run(_await(result))


async def _await(result: Any) -> None:
    await result


def evaluate(
    resources: Sequence[Resource],
    policies: Sequence[Policy],
    config: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Violation]:
    """Every violation ``policies`` report for ``resources``; policies set to ``disabled`` are skipped."""
    config = config or {}
    violations: list[Violation] = []
    by_urn = {r.urn: r.name for r in resources}
    for policy in policies:
        overrides = dict(config.get(policy.name, {}))
        level = _level(policy, overrides)
        if level == EnforcementLevel.DISABLED.value:
            continue
        settings = policy_config(policy, overrides)

        def report(message: str, urn: str | None = None, _p: str = policy.name, _l: str = level) -> None:
            violations.append(Violation(_p, _l, message, urn, by_urn.get(urn or "")))

        if isinstance(policy, ResourceValidationPolicy):
            for r in resources:
                if not getattr(r, "custom", True):
                    continue
                args = ResourceValidationArgs(
                    r.type, unknown_checking_proxy(dict(r.props)), r.urn, r.name, _options(), None, settings
                )

                def report_resource(message: str, urn: str | None = None, _urn: str = r.urn) -> None:
                    report(message, urn or _urn)

                _guarded(policy.validate, args, report_resource)
        elif isinstance(policy, StackValidationPolicy):
            _guarded(policy.validate, StackValidationArgs(_stack(resources), settings), report)
    return violations


def _stack(resources: Sequence[Resource]) -> list[PolicyResource]:
    """The resources as a stack policy sees them, parents and dependencies linked (by the recorded URNs: a
    resource's ``parent`` and ``dependencies``, when it has them)."""
    stack = [
        PolicyResource(r.type, unknown_checking_proxy(dict(r.props)), r.urn, r.name, _options(), None, None, [], {})
        for r in resources
    ]
    by_urn: dict[str, PolicyResource] = {}
    for made in stack:
        by_urn.setdefault(made.urn, made)
    for r, made in zip(resources, stack, strict=True):
        made.parent = by_urn.get(getattr(r, "parent", None) or "")
        made.dependencies = [by_urn[urn] for urn in getattr(r, "dependencies", ()) if urn in by_urn]
    return stack


def _guarded(validate: Any, args: Any, report: Any) -> None:
    try:
        _run(validate(args, report))
    except Exception as exc:  # a policy saying "not applicable" is not a failure
        if type(exc).__name__ != "_NotApplicableError":
            raise
