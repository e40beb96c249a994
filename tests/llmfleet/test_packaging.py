"""Packaging: a runtime install (`pip install .`, the container images) carries no Pulumi and needs none."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from llmfleet.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
PULUMI = {"pulumi", "pulumi-aws", "pulumi-kubernetes", "pulumi-policy"}
# Commands whose modules a runtime image runs; `policy` (the Pulumi program's) and `dashboards` (generated with
# grafana-foundation-sdk) need the `infra` extra.
INFRA_COMMANDS = {"policy", "dashboards"}
RUNTIME_COMMANDS = sorted(name for name in COMMANDS if name not in INFRA_COMMANDS)


def _names(requirements: list[str]) -> set[str]:
    return {req.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip() for req in requirements}


def test_pulumi_is_only_in_the_infra_extra_which_dev_pulls_in() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert not _names(project["dependencies"]) & PULUMI
    assert PULUMI <= _names(extras["infra"])
    assert "llmfleet[infra]" in extras["dev"]


def test_no_runtime_command_imports_pulumi_or_the_program() -> None:
    # A fresh interpreter (this one has the program loaded by other tests): after importing each command's
    # module, the Pulumi, program and policy modules loaded so far.
    code = """
import importlib, json, sys
loaded = {}
for name, module in json.loads(sys.argv[1]).items():
    importlib.import_module(module)
    loaded[name] = sorted(m for m in sys.modules if m.split(".")[0] in json.loads(sys.argv[2]))
print(json.dumps(loaded))
"""
    modules = {name: COMMANDS[name][0] for name in RUNTIME_COMMANDS}
    banned = ["pulumi", "pulumi_aws", "pulumi_kubernetes", "pulumi_policy", "infra", "policies"]
    argv = [sys.executable, "-c", code, json.dumps(modules), json.dumps(banned)]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == {name: [] for name in RUNTIME_COMMANDS}


def _admitted(ignore: str) -> set[str]:
    """The folders a ``.dockerignore`` of the form ``*`` then ``!folder/`` lines lets into the build context."""
    lines = [line.strip() for line in ignore.splitlines()]
    assert "*" in lines, "the build context starts from nothing"
    return {line[1:].rstrip("/") for line in lines if line.startswith("!") and line.endswith("/")}


def test_the_image_build_context_admits_every_package_and_every_folder_an_image_copies() -> None:
    admitted = _admitted((ROOT / ".dockerignore").read_text())
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["packages"]
    copied = {
        line.split()[1].rstrip("/")
        for dockerfile in (ROOT / "images").glob("*.Dockerfile")
        for line in dockerfile.read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line and line.split()[1].endswith("/")
    }
    assert set(packages) <= admitted, sorted(set(packages) - admitted)
    assert copied <= admitted, sorted(copied - admitted)


def test_a_folder_missing_from_the_build_context_is_caught() -> None:
    assert "control_plane" not in _admitted("*\n!fleet/\n!autoscaler/\n")
