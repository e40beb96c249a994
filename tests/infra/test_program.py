"""The program's wiring: config in, rendered stack file, secrets, targets, capacity blocks, `__main__`."""

from __future__ import annotations

import ipaddress
import json
import runpy
from pathlib import Path
from typing import Any

import pulumi
import pytest

from fleet.protocol import contract
from fleet.protocol.keys import hash_api_key
from fleet.spec.errors import SpecError
from fleet.spec.loader import parse_spec
from infra.config import spec_from_config, stack_config
from infra.k8s_base import render_stack_file
from infra.network import subnet_cidrs
from infra.offline import OfflineRun, run_offline
from infra.program import FleetInputs, LocalTarget, build_fleet
from infra.stack_run import PLACEHOLDER_KEYS, offline_config, offline_run
from tests.support.stacks import stack_document

MAIN = Path(__file__).resolve().parents[2] / "infra" / "__main__.py"


def test_rendered_stack_file_reparses_to_the_deployed_spec(prod: OfflineRun) -> None:
    configmaps = prod.of_type("kubernetes:core/v1:ConfigMap")
    (configmap,) = [c for c in configmaps if c.props["metadata"]["name"] == contract.SPEC_CONFIGMAP]
    ((key, text),) = configmap.props["data"].items()
    assert key == "Pulumi.prod.yaml"
    import yaml

    reparsed = parse_spec(yaml.safe_load(text), name="prod").spec
    original = parse_spec(stack_document("prod"), name="prod").spec
    assert reparsed.control_plane.url == "http://llmfleet-control-plane.llmfleet.svc.cluster.local:8090"
    assert reparsed.model_copy(update={"control_plane": original.control_plane}) == original
    assert render_stack_file(original) == text


def test_tenant_secret_holds_hashes_never_keys(prod: OfflineRun) -> None:
    (secret,) = [
        s
        for s in prod.of_type("kubernetes:core/v1:Secret")
        if s.props["metadata"]["name"] == contract.TENANT_KEYS_SECRET
    ]
    table = json.loads(secret.props["stringData"]["tenant-keys.json"])
    placeholder = json.loads(PLACEHOLDER_KEYS)[0]
    assert table == {"acme": [hash_api_key(placeholder)], "research": [hash_api_key(placeholder)]}
    assert placeholder not in json.dumps(secret.props)


def test_stack_config_encodes_structures_as_json_and_skips_ciphertext() -> None:
    document = {"config": {"llmfleet:target": "aws", "llmfleet:pools": [{"name": "a"}], "x:k": {"secure": "v1:abc"}}}
    config = stack_config(document)
    assert config == {"llmfleet:target": "aws", "llmfleet:pools": '[{"name": "a"}]'}


def test_spec_from_config_reports_every_problem_with_its_key_path() -> None:
    document = stack_document("prod", **{"pools.0.engine.gpuMemoryUtilization": 1.5, "gateway.replicaz": 3})

    def program() -> None:
        spec_from_config("prod")

    with pytest.raises(SpecError) as error:
        run_offline(program, stack_config(document), stack="prod")
    paths = {p.path for p in error.value.problems}
    assert "llmfleet:pools[0].engine.gpuMemoryUtilization" in paths
    assert "llmfleet:gateway.replicaz" in paths


def test_local_target_is_refused_with_a_pointer_to_llmfleet_up() -> None:
    spec = parse_spec(stack_document("local"), name="local").spec
    with pytest.raises(LocalTarget, match="llmfleet up --stack local"):
        build_fleet(FleetInputs(spec, "{}"))

    def program() -> None:
        runpy.run_path(str(MAIN))

    with pytest.raises(pulumi.RunError, match="llmfleet up"):
        run_offline(program, stack_config(stack_document("local")), stack="local")


def test_main_wires_config_to_components_and_exports(prod: OfflineRun) -> None:
    config, secrets = offline_config(stack_document("prod"), "prod")

    def program() -> None:
        runpy.run_path(str(MAIN))

    run = run_offline(program, config, stack="prod", secret_keys=secrets)
    assert sorted((r.type, r.name) for r in run.resources) == sorted((r.type, r.name) for r in prod.resources)


def test_missing_tenant_secret_fails_the_program() -> None:
    def program() -> None:
        runpy.run_path(str(MAIN))

    with pytest.raises(pulumi.ConfigMissingError):
        run_offline(program, stack_config(stack_document("prod")), stack="prod")


def _capacity_block_document() -> dict[str, Any]:
    return stack_document(
        "prod",
        **{
            "gpuNodeGroups.0.capacityType": "capacity-block",
            "gpuNodeGroups.0.zones": ["us-east-1a"],
            "capacityBlocks:a100-us-east-1a": "cr-0123456789abcdef0",
        },
    )


def test_capacity_block_groups_target_their_reservation_in_one_zone() -> None:
    run = offline_run(_capacity_block_document(), "prod")
    (group,) = [g for g in run.of_type("aws:eks/nodeGroup:NodeGroup") if g.props["amiType"].endswith("NVIDIA")]
    assert group.props["capacityType"] == "CAPACITY_BLOCK"
    assert "instanceTypes" not in group.props
    template = run.named("aws:ec2/launchTemplate:LaunchTemplate", "nodes-a100-us-east-1a")
    assert template.props["instanceMarketOptions"] == {"marketType": "capacity-block"}
    target = template.props["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target == {"capacityReservationId": "cr-0123456789abcdef0"}
    assert group.props["tags"][contract.TAG_ZONE] == "us-east-1a"


def test_capacity_block_without_reservation_config_says_what_to_set() -> None:
    config, secrets = offline_config(_capacity_block_document(), "prod")
    del config["capacityBlocks:a100-us-east-1a"]

    def program() -> None:
        runpy.run_path(str(MAIN))

    with pytest.raises(ValueError, match="pulumi config set capacityBlocks:a100-us-east-1a"):
        run_offline(program, config, stack="prod", secret_keys=secrets)


def test_zone_subnets_never_overlap() -> None:
    networks = [ipaddress.ip_network(c) for i in range(6) for c in subnet_cidrs(i)]
    assert all(n.subnet_of(ipaddress.ip_network("10.0.0.0/16")) for n in networks)
    assert not any(a.overlaps(b) for i, a in enumerate(networks) for b in networks[i + 1 :])
    with pytest.raises(ValueError):
        subnet_cidrs(6)


def test_no_program_module_shadows_an_importable_module() -> None:
    # Pulumi's exec shim puts infra/ first on sys.path: a module there named like a package the program (or
    # anything it imports) needs would be imported instead of it, as infra/gateway.py once replaced `gateway`.
    import importlib.util

    stems = sorted(p.stem for p in MAIN.parent.glob("*.py") if p.stem not in ("__init__", "__main__"))
    found = {stem: importlib.util.find_spec(stem) for stem in stems}
    # A spec without an origin is a namespace package (a bare folder such as images/): nothing imports it.
    shadowed = [stem for stem, spec in found.items() if spec is not None and spec.origin is not None]
    assert stems and shadowed == []


def test_main_on_pulumis_sys_path_refuses_an_unknown_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pulumi runs infra/__main__.py with infra/ first on sys.path; plugin names must still be checked there.
    monkeypatch.syspath_prepend(str(MAIN.parent))
    config, secrets = offline_config(stack_document("prod"), "prod")
    broken = stack_document("prod", **{"gateway.routing.picker": {"name": "no-such-picker"}})
    config.update(stack_config(broken))

    def program() -> None:
        runpy.run_path(str(MAIN))

    with pytest.raises(SpecError) as error:
        run_offline(program, config, stack="prod", secret_keys=secrets)
    (problem,) = [p for p in error.value.problems if p.path.startswith("llmfleet:gateway.routing.picker")]
    assert "no-such-picker" in problem.render() and "p2c" in problem.render()
