"""Offline: run the Pulumi program in-process under `pulumi.runtime.set_mocks`, recording every resource.

No CLI, no plugins, no cloud: the mock engine answers each registration with the inputs plus the few outputs
the program reads (ARNs, the cluster endpoint, OIDC issuer and security group, the Redis endpoint, the gateway's
load balancer hostname), so the recorded ``props`` have the shape a policy sees at ``pulumi preview``: camelCase,
outputs merged over inputs. Each resource also keeps the URNs it depends on, so tests can check the order.

Pulumi's mock settings are process-global: `run_offline` installs a fresh monitor for each run and runs the
program to completion (every registration drained) before it returns, so runs never share resources. Runs
are serialised by a lock; don't run the program concurrently in one process.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks

__all__ = ["OfflineRun", "RecordedResource", "RecordingMocks", "run_offline"]

_LOCK = threading.Lock()
_LOOP: list[asyncio.AbstractEventLoop] = []


def _current_loop() -> asyncio.AbstractEventLoop | None:
    """The thread's current loop without creating one (``get_event_loop`` would make an orphan loop)."""
    local = getattr(asyncio.get_event_loop_policy(), "_local", None)
    loop = getattr(local, "_loop", None)
    return loop if isinstance(loop, asyncio.AbstractEventLoop) else None


def _runtime_loop() -> asyncio.AbstractEventLoop:
    """The event loop every offline run uses (created once; replaced only if someone closed it)."""
    if not _LOOP or _LOOP[0].is_closed():
        _LOOP[:] = [asyncio.new_event_loop()]
    return _LOOP[0]


_SECRET_SIG = "4dabf18193072939515e22adb298388d"


@dataclass(frozen=True)
class RecordedResource:
    """One registered resource: type token, logical name, URN, its props (camelCase), and the URNs it waits for
    (``dependencies``: its ``depends_on`` plus the resources whose outputs its inputs use, as the engine sees them).
    """

    type: str
    name: str
    urn: str
    props: dict[str, Any]
    custom: bool
    parent: str | None = None
    dependencies: tuple[str, ...] = ()


@dataclass
class OfflineRun:
    """What one program run registered, in registration order, plus the values the program returned."""

    project: str
    stack: str
    resources: list[RecordedResource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def of_type(self, type_token: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == type_token]

    def named(self, type_token: str, name: str) -> RecordedResource:
        for r in self.of_type(type_token):
            if r.name == name:
                return r
        raise KeyError(f"no {type_token} named {name!r}; have {[r.name for r in self.of_type(type_token)]}")

    def depends_on(self, resource: RecordedResource, other: RecordedResource) -> bool:
        """Whether ``resource`` waits for ``other`` (directly, as registered)."""
        return other.urn in resource.dependencies


def _unsecret(value: Any) -> Any:
    """Drop Pulumi's secret envelopes (``{sig: ..., value: ...}``) so policies see plain values."""
    if isinstance(value, dict):
        if _SECRET_SIG in value:
            return _unsecret(value.get("value"))
        return {k: _unsecret(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unsecret(v) for v in value]
    return value


def _mock_outputs(typ: str, name: str, inputs: Mapping[str, Any], region: str) -> tuple[str, dict[str, Any]]:
    """A plausible id and the outputs the program reads, per resource type."""
    outputs: dict[str, Any] = {}
    if typ.startswith("aws:"):
        outputs["arn"] = f"arn:aws:mock:{region}:000000000000:{typ.split(':')[-1].lower()}/{name}"
    rid = f"{name}-id"
    if typ == "aws:eks/cluster:Cluster":
        outputs.update(
            name=inputs.get("name", name),
            endpoint=f"https://{name}.eks.{region}.amazonaws.com",
            certificateAuthority={"data": "bW9jaw=="},
            identities=[{"oidcs": [{"issuer": f"https://oidc.eks.{region}.amazonaws.com/id/{name.upper()}"}]}],
        )
        outputs["vpcConfig"] = {**dict(inputs.get("vpcConfig") or {}), "clusterSecurityGroupId": f"sg-{name}"}
        rid = str(inputs.get("name", name))
    elif typ == "aws:iam/openIdConnectProvider:OpenIdConnectProvider":
        outputs["url"] = str(inputs.get("url", "")).removeprefix("https://")
    elif typ == "aws:s3/bucket:Bucket":
        rid = str(inputs.get("bucket") or f"{name}-bucket")
        outputs["bucket"] = rid
    elif typ == "aws:eks/nodeGroup:NodeGroup":
        outputs["nodeGroupName"] = inputs.get("nodeGroupName", name)
    elif typ == "aws:ecr/repository:Repository":
        outputs["repositoryUrl"] = f"000000000000.dkr.ecr.{region}.amazonaws.com/{inputs.get('name', name)}"
    elif typ == "aws:elasticache/replicationGroup:ReplicationGroup":
        outputs["primaryEndpointAddress"] = f"master.{name}.cache.amazonaws.com"
        outputs["port"] = inputs.get("port", 6379)
    elif typ == "kubernetes:core/v1:Service" and (inputs.get("spec") or {}).get("type") == "LoadBalancer":
        outputs["status"] = {"loadBalancer": {"ingress": [{"hostname": f"{name}.elb.{region}.amazonaws.com"}]}}
    return rid, outputs


class RecordingMocks(pulumi.runtime.Mocks):
    """Answers registrations (inputs plus `_mock_outputs`) and the few invokes the program makes."""

    def __init__(self, region: str = "us-east-1") -> None:
        self.region = region

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        inputs = _unsecret(dict(args.inputs))
        rid, extra = _mock_outputs(args.typ, args.name, inputs, self.region)
        return rid, {**inputs, **extra} if args.typ == "aws:eks/cluster:Cluster" else {**extra, **inputs}

    def call(self, args: pulumi_mocks.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": "000000000000", "arn": "arn:aws:iam::000000000000:user/mock", "userId": "m"}, []
        if args.token == "aws:index/getPartition:getPartition":
            return {"partition": "aws", "dnsSuffix": "amazonaws.com"}, []
        return {}, []


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    """The mock monitor, also keeping each registration's URN, parent and custom flag in order."""

    def __init__(self, mocks: RecordingMocks) -> None:
        super().__init__(mocks)
        self.recorded: list[RecordedResource] = []
        self._lock = threading.Lock()

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 (gRPC method name)
        # pulumi's MockMonitor.RegisterResource has no annotations (pulumi/runtime/mocks.py).
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        registration = self.resources.get(response.urn)
        if registration is not None:
            with self._lock:
                self.recorded.append(
                    RecordedResource(
                        type=request.type,
                        name=request.name,
                        urn=response.urn,
                        props=dict(registration.state),
                        custom=bool(request.custom),
                        parent=request.parent or None,
                        dependencies=tuple(request.dependencies),
                    )
                )
        return response


def run_offline(
    program: Callable[[], Mapping[str, Any] | None],
    config: Mapping[str, str],
    *,
    stack: str,
    project: str = "llmfleet",
    secret_keys: list[str] | None = None,
    region: str = "us-east-1",
) -> OfflineRun:
    """Run ``program`` under fresh mocks with ``config`` (``ns:key`` -> str); return what it registered.

    ``program`` builds resources and may return a mapping of Outputs/values (resolved into ``outputs``).
    Exceptions raised by the program (or inside its applies) propagate.
    """
    with _LOCK:
        # Pulumi's runtime needs a current event loop (a caller may have none, e.g. after `asyncio.run`). All
        # runs share one loop: its executor threads each hold a loop Pulumi's mocks create, which must stay
        # alive (a closed executor would drop them unclosed). The caller's loop is put back afterwards.
        previous = _current_loop()
        asyncio.set_event_loop(_runtime_loop())
        monitor = _RecordingMonitor(RecordingMocks(region=region))
        run = OfflineRun(project=project, stack=stack)
        resolved: dict[str, Any] = {}

        def body() -> pulumi.Output[Any]:
            returned = dict(program() or {})
            keys = list(returned)
            return pulumi.Output.all(*[returned[k] for k in keys]).apply(
                lambda values: resolved.update(zip(keys, values, strict=True))
            )

        try:
            pulumi.runtime.set_mocks(monitor.mocks, project=project, stack=stack, preview=False, monitor=monitor)
            pulumi.runtime.set_all_config(dict(config), secret_keys=list(secret_keys or []))
            # pulumi.runtime.test's wrapper is unannotated (pulumi/runtime/mocks.py): the call is typed as untyped.
            pulumi.runtime.test(body)()  # type: ignore[no-untyped-call]
        finally:
            pulumi.runtime.set_all_config({})
            asyncio.set_event_loop(previous)
        run.resources = list(monitor.recorded)
        run.outputs = _unsecret(resolved)
        return run
