"""The policy pack entry point (``pulumi up --policy-pack policies``): serve `policies.pack.POLICIES`."""

from pulumi_policy import PolicyPack

from policies.pack import ENFORCEMENT_LEVEL, PACK_NAME, POLICIES

PolicyPack(name=PACK_NAME, policies=POLICIES, enforcement_level=ENFORCEMENT_LEVEL)
