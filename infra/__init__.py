"""infra: the Pulumi program for AWS EKS + Kubernetes, built from a stack's FleetSpec.

Importing this package is cheap: only the modules that build resources import pulumi_aws and
pulumi_kubernetes. `fleet.protocol.contract` holds the names, labels and annotations the policy pack reads.

Typing: the package is checked with ``mypy --strict -p infra -p policies``. pulumi_kubernetes' overloads take
TypedDicts, which plain nested dicts of mixed values never match, so resource calls carry
``type: ignore[call-overload]``. Their shape is asserted instead by the graph tests in ``tests/infra``.
"""
