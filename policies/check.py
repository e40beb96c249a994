"""``llmfleet policy check --stack NAME [--file STACK_FILE]``: the program under mocks against the policy pack.

Runs the real Pulumi program in-process (`infra.stack_run`, no CLI, no cloud) with the stack's config, feeds
every registered resource through `policies.pack.POLICIES`, prints the violations as a table and exits 1
when any is mandatory. ``--file`` checks an edited stack file before it is committed; secrets the CLI would
decrypt are replaced by placeholders (only their hashes reach resources). A ``local`` stack has no cloud
resources: the check says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleet.spec.errors import SpecError
from fleet.spec.loader import find_stack, parse_spec
from fleet.spec.stack import FleetSpec
from llmfleet.registries import all_registries

__all__ = ["CheckResult", "add_arguments", "check_stack", "render_table", "run"]


@dataclass
class CheckResult:
    stack: str
    spec: FleetSpec
    resources: int
    violations: list[Any]  # policies.runner.Violation

    @property
    def mandatory(self) -> int:
        return sum(1 for v in self.violations if v.mandatory)


def read_document(stack: str, file: str | None) -> tuple[dict[str, Any], str]:
    """The stack document (``--file`` overrides the stack's own file) and the file it came from."""
    path = Path(file) if file else find_stack(stack)
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"llmfleet policy check: cannot read {path}: {exc}") from exc
    return (document if isinstance(document, dict) else {}), str(path)


def check_stack(
    document: Mapping[str, Any], stack: str, policy_config: Mapping[str, Mapping[str, Any]] | None = None
) -> CheckResult:
    """Validate, run offline (unless local) and evaluate the pack; raises SpecError on an invalid stack."""
    spec = parse_spec(document, name=stack, registries=all_registries()).spec
    if spec.target == "local":
        return CheckResult(stack, spec, 0, [])
    from infra.stack_run import offline_run
    from policies.pack import POLICIES
    from policies.runner import evaluate

    run = offline_run(document, stack)
    custom = [r for r in run.resources if r.custom]
    # Stack policies see components too: a child waits for its parent's dependencies (`policies.first_up`).
    return CheckResult(stack, spec, len(custom), evaluate(run.resources, POLICIES, policy_config))


def render_table(violations: list[Any]) -> str:
    """Violations as an aligned table: level, policy, resource, message (mandatory first)."""
    rows = [("LEVEL", "POLICY", "RESOURCE", "MESSAGE")]
    ordered = sorted(violations, key=lambda v: (not v.mandatory, v.policy, v.resource or ""))
    rows += [(v.level, v.policy, v.resource or "(stack)", v.message) for v in ordered]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3] for row in rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="check")
    check = sub.add_parser("check", help="run the program under mocks and evaluate the policy pack")
    check.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<name>.yaml)")
    check.add_argument("--file", help="stack file to check instead of the stack's own (e.g. an edited copy)")
    check.add_argument("--policy-config", help="JSON file {policy: {key: value, enforcementLevel: ...}} (as pulumi's)")
    check.add_argument("--json", action="store_true", help="print the violations as JSON")


def run(args: argparse.Namespace) -> int:
    document, path = read_document(args.stack, args.file)
    overrides: dict[str, Any] = {}
    if args.policy_config:
        overrides = json.loads(Path(args.policy_config).read_text())
    try:
        result = check_stack(document, args.stack, overrides)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 1
    if result.spec.target == "local":
        print(
            f"stack {args.stack} ({path}) has target 'local': no cloud resources to check. "
            f"It runs on this machine with `llmfleet up --stack {args.stack}`."
        )
        return 0
    if args.json:
        print(json.dumps([v.__dict__ for v in result.violations], indent=2))
    else:
        print(f"stack {args.stack} ({path}, target {result.spec.target}): {result.resources} resources checked")
        if result.violations:
            print(render_table(result.violations))
        advisory = len(result.violations) - result.mandatory
        print(f"{result.mandatory} mandatory, {advisory} advisory violation(s)")
    return 1 if result.mandatory else 0
