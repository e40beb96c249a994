"""``llmfleet hash-key``: read an API key on stdin (or as an argument) and print its stored form."""

from __future__ import annotations

import argparse
import sys

from fleet.protocol.keys import hash_api_key

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", nargs="?", help="the key (default: read one line from stdin)")


def run(args: argparse.Namespace) -> int:
    key = args.key if args.key is not None else sys.stdin.readline().strip()
    if not key:
        print("error: empty key", file=sys.stderr)
        return 2
    print(hash_api_key(key))
    return 0
