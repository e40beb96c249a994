"""infra: the Pulumi program for AWS EKS + Kubernetes, built from a stack's FleetSpec.

Importing this package is cheap: only the modules that build resources import pulumi_aws and
pulumi_kubernetes. `infra.contract` holds the names, labels and annotations the policy pack reads.
"""
