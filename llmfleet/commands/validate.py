"""``llmfleet validate [--stack NAME | FILE ...]``: check stack files, print every problem, exit 1 on errors."""

from __future__ import annotations

import argparse
import sys

from fleet.spec.errors import SpecError
from fleet.spec.loader import list_stacks, load_spec
from llmfleet.registries import all_registries

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", help="stack files to check (default: every stack in stacks/)")
    parser.add_argument("--stack", action="append", default=[], help="a stack by name (repeatable)")


def run(args: argparse.Namespace) -> int:
    targets: list[str] = [*args.stack, *args.files] or list_stacks()
    failed = 0
    for target in targets:
        try:
            loaded = load_spec(target, registries=all_registries())
        except SpecError as exc:
            failed += 1
            print(f"FAIL {exc.file}", file=sys.stderr)
            for problem in exc.problems:
                print(f"  error: {problem.path}: {problem.message}" + _got(problem.value), file=sys.stderr)
            continue
        print(f"ok   {loaded.file}")
        for warning in loaded.warnings:
            print(f"  warning: {warning.path}: {warning.message}")
    return 1 if failed else 0


def _got(value: object) -> str:
    return "" if value is None else f" (got {value!r})"
