"""CLI: ``llmfleet <command>``; each command is a module with ``add_arguments(parser)`` and ``run(args)``.

Commands are imported only when invoked, so ``llmfleet validate`` never pays for the gateway's or Pulumi's
imports, and each component owns its own command module.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

__all__ = ["COMMANDS", "main"]


class Command(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("llmfleet.commands.validate", "validate stack files (all stacks when none is given)"),
    "plan": ("llmfleet.commands.plan", "print a stack's capacity plan: replicas, GPUs, nodes, KV, cost"),
    "preflight": (
        "llmfleet.commands.preflight",
        "read-only checks of the AWS account a stack deploys to, before `pulumi up`",
    ),
    "hash-key": ("llmfleet.commands.hash_key", "print the sha256 form of an API key for a stack file"),
    "model": ("llmfleet.commands.model", "push a model directory to the stack's model store (`model push`)"),
    "sim": ("engine_sim.cli", "the vLLM-compatible engine simulator (`sim serve MODEL`)"),
    "agent": ("agent.cli", "the on-node agent supervising one engine replica"),
    "gateway": ("gateway.cli", "the OpenAI-compatible gateway"),
    "control-plane": ("control_plane.cli", "the control plane: reports, discovery, leases, autoscaling"),
    "up": ("llmfleet.local.up", "run the whole fleet on this machine"),
    "status": ("llmfleet.local.status", "show pools, replicas and recent scaling decisions"),
    "load": ("llmfleet.local.load", "send a realistic request mix through the gateway"),
    "slo": ("llmfleet.commands.slo", "show each pool's error budget per SLO (spent, remaining, burn rate, freeze)"),
    "policy": ("policies.check", "run the Pulumi program under mocks against the policy pack"),
    "dashboards": ("infra.dashboards.command", "write the stack's Grafana dashboards as JSON (--render: as PNG)"),
    "simulate": ("simulate.cli", "replay a request trace through a pool in virtual time; compare configurations"),
    "simulate-shared": (
        "simulate.shared_cli",
        "replay a trace into each of several pools, sharing one node group's GPUs against groups of their own",
    ),
    "gate": (
        "rollout.gate_cli",
        "capacity-regression gate: a candidate pool's replica against its baseline's, side by side",
    ),
    "rollout": ("rollout.rollout_cli", "canary rollout of an alias to a candidate pool (start, status, abort)"),
}


def _top_parser() -> argparse.ArgumentParser:
    width = max(len(name) for name in COMMANDS)
    listing = "\n".join(f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items())
    return argparse.ArgumentParser(
        prog="llmfleet",
        description="Run LLM inference fleets from one declarative stack file.",
        epilog=f"commands:\n{listing}\n\n`llmfleet COMMAND --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not args or args[0] in ("-h", "--help"):
        top.print_help()
        return 0 if args else 2
    name = args[0]
    if name not in COMMANDS:
        top.error(f"unknown command {name!r}; commands: {', '.join(COMMANDS)}")
    module_name, text = COMMANDS[name]
    command = cast(Command, importlib.import_module(module_name))
    parser = argparse.ArgumentParser(prog=f"llmfleet {name}", description=text)
    command.add_arguments(parser)
    return command.run(parser.parse_args(args[1:]))


if __name__ == "__main__":
    raise SystemExit(main())
