"""The policy pack entry point (``pulumi up --policy-pack policies``): serve `policies.pack.POLICIES`."""

from pulumi_policy import EnforcementLevel, PolicyPack

from policies.pack import PACK_NAME, POLICIES

PolicyPack(name=PACK_NAME, policies=POLICIES, enforcement_level=EnforcementLevel.ADVISORY)
