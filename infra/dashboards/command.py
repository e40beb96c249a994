"""``llmfleet dashboards --stack NAME [--out DIR] [--render PROM_URL]``: the stack's Grafana dashboards as JSON.

Writes ``<out>/<name>.json`` for each dashboard (`infra.dashboards.DASHBOARDS`; ``--out`` defaults to
``dashboards/<stack>``). With ``--render PROM_URL`` it also draws each one as ``<out>/<name>.png`` from that
Prometheus over the last ``--since`` (`infra.dashboard_render`: Grafana itself is not needed), with the
variables at their first value unless ``--var name=value`` says otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from fleet.spec.errors import SpecError
from fleet.spec.loader import load_spec
from infra.dashboards import build_dashboards, write_dashboards
from llmfleet.registries import all_registries

__all__ = ["add_arguments", "parse_duration", "run"]

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``6h``, ``2d`` -> seconds; ArgumentTypeError otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: a whole number and s, m, h or d (e.g. 1h)")
    return float(int(match.group(1)) * _UNIT_S[match.group(2)])


def _variable(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE (e.g. pool=qwen-7b)")
    return name, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<name>.yaml) or a file")
    parser.add_argument("--out", type=Path, help="folder for the JSON (and PNG) files (default dashboards/<stack>)")
    parser.add_argument("--render", metavar="PROM_URL", help="also draw each dashboard as PNG from this Prometheus")
    parser.add_argument("--since", type=parse_duration, default=3600.0, help="rendered time range (default 1h)")
    parser.add_argument("--scrape-interval", type=parse_duration, default=15.0, help="Prometheus' (default 15s)")
    parser.add_argument("--var", type=_variable, action="append", default=[], help="variable value, NAME=VALUE")


def run(args: argparse.Namespace) -> int:
    try:
        loaded = load_spec(args.stack, registries=all_registries())
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 1
    out: Path = args.out or Path("dashboards") / loaded.name
    for path in write_dashboards(loaded.spec, out):
        print(f"wrote {path}")
    if args.render:
        from infra.dashboard_render import RenderError, render  # matplotlib only when drawing

        end = time.time()
        for name, model in build_dashboards(loaded.spec).items():
            try:
                drawn = render(
                    model,
                    args.render,
                    end - args.since,
                    end,
                    out / f"{name}.png",
                    variables=dict(args.var),
                    scrape_interval_s=args.scrape_interval,
                )
            except RenderError as exc:
                print(f"llmfleet dashboards: {exc}", file=sys.stderr)
                return 1
            print(f"drew {drawn.path}" + (f" (no data: {', '.join(drawn.empty)})" if drawn.empty else ""))
    return 0
