"""The agent command line: option defaults from the stack, and configuration errors that exit 2 at once."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from agent import cli
from fleet.spec.loader import load_spec


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_come_from_the_stack(write_stack: Callable[..., Path]) -> None:
    stack = write_stack(controlPlane={"port": 9999})
    args = parse("--stack", str(stack), "--pool", "qwen-7b", "--port", "7000")
    options = cli.build_options(args, load_spec(stack).spec)
    assert options.control_plane == "http://127.0.0.1:9999"  # local stack: loopback
    assert options.engine_port > 0 and options.engine_host == "127.0.0.1"
    assert options.replica.endswith("-7000") and options.log_path is not None
    assert options.report_interval_s == 1.0


@pytest.mark.parametrize(("flag", "expected"), [("none", None), ("http://cp:1", "http://cp:1")])
def test_control_plane_flag_wins(write_stack: Callable[..., Path], flag: str, expected: str | None) -> None:
    stack = write_stack()
    args = parse("--stack", str(stack), "--pool", "qwen-7b", "--port", "1", "--control-plane", flag)
    assert cli.build_options(args, load_spec(stack).spec).control_plane == expected


@pytest.mark.parametrize(
    ("overrides", "argv_tail", "message"),
    [
        ({}, ("--pool", "nope"), "no pool 'nope'"),
        (
            {"pools.0.engine.kind": "vllm", "pools.0.engine.extraArgs": ["--swap-space", "4"]},
            ("--pool", "qwen-7b"),
            "removed",
        ),
    ],
)
def test_configuration_errors_exit_2_before_starting_anything(
    write_stack: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    overrides: dict[str, object],
    argv_tail: tuple[str, ...],
    message: str,
) -> None:
    stack = write_stack(**overrides)
    assert cli.run(parse("--stack", str(stack), "--port", "1", *argv_tail)) == 2
    assert message in capsys.readouterr().err
