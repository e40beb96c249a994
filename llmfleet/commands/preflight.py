"""``llmfleet preflight --stack NAME``: read-only checks of the AWS account a target-aws stack deploys to.

    llmfleet preflight --stack NAME [--bucket B] [--hostname H] [--check NAME]...

Run it before ``pulumi up`` with the credentials ``pulumi up`` will use: it asks the account what a first
``up`` would otherwise find out after creating the cluster (`llmfleet.commands.preflight_checks` lists every check
and the calls it makes; none changes anything). It prints one line per problem and exits 1 when there is any,
0 when there is none, 2 when the stack file itself is invalid or not a target-aws stack.

The model bucket is ``--bucket``, else the stack's output ``modelBucket`` (``pulumi stack output``), read as
``llmfleet model push`` reads it. The gateway's host name, which the certificate must name, is ``--hostname``,
else the stack's ``gateway.hostname``. Credentials, region endpoint overrides and profiles follow boto3's own
settings (``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, ...); the region is the stack's ``aws:region``.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

from fleet.spec.loader import load_or_report
from llmfleet.commands.preflight_checks import CHECKS, ClientFactory, PreflightContext, run_checks
from llmfleet.registries import all_registries

__all__ = ["add_arguments", "boto3_clients", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<name>.yaml) or a file")
    parser.add_argument("--bucket", help="the model bucket (default: the stack's modelBucket output)")
    parser.add_argument("--hostname", help="the gateway's host name (default: the stack's gateway.hostname)")
    parser.add_argument(
        "--check",
        action="append",
        choices=sorted(CHECKS),
        help="run only this check (repeatable; default: every check)",
    )


def boto3_clients(region: str) -> ClientFactory:
    """boto3 clients of ``region``, one per service, from boto3's default credential chain."""
    import boto3

    session = boto3.session.Session(region_name=region)

    @functools.cache
    def client(service: str) -> Any:
        return session.client(service)

    return client


def _bucket(args: argparse.Namespace, stack: str, file: str) -> str | None:
    if args.bucket:
        return str(args.bucket)
    from llmfleet.commands.model import PushError, _stack_bucket

    try:
        return _stack_bucket(stack, Path(file))
    except PushError:
        return None  # the model-manifest check says the bucket is unknown


def run(args: argparse.Namespace, clients: ClientFactory | None = None) -> int:
    """Print every problem found; ``clients`` replaces boto3's (tests)."""
    loaded = load_or_report(args.stack, registries=all_registries())
    if loaded is None:
        return 2
    spec = loaded.spec
    if spec.target != "aws":
        print(f"llmfleet preflight: stack {loaded.name} is target {spec.target}; preflight checks AWS accounts")
        return 2
    names = list(args.check or CHECKS)
    uses_bucket = "model-manifest" in names
    ctx = PreflightContext(
        stack=loaded.name,
        spec=spec,
        clients=clients or boto3_clients(spec.region),
        bucket=_bucket(args, loaded.name, loaded.file) if uses_bucket else None,
        hostname=args.hostname or spec.gateway.hostname,
    )
    findings = run_checks(ctx, names)
    for finding in findings:
        print(finding.render())
    checked = f"{len(names)} check{'s' if len(names) != 1 else ''}"
    if findings:
        print(f"preflight {loaded.name}: {len(findings)} problem{'s' if len(findings) != 1 else ''} ({checked})")
        return 1
    print(f"preflight {loaded.name}: no problems ({checked}: {', '.join(names)})")
    return 0
