"""infra: the Pulumi program for AWS EKS + Kubernetes, built from a stack's FleetSpec.

Importing this package is cheap: only the modules that build resources import pulumi_aws and
pulumi_kubernetes. `fleet.protocol.contract` holds the names, labels and annotations the policy pack reads.

Typing: mypy checks the package strictly (``[tool.mypy] packages``). Pod, Deployment and Service specs are plain
dicts built by pure functions; `infra.k8s_shapes.shaped` names the pulumi_kubernetes TypedDict each one stands
for where it meets its resource (docs/architecture.md, "infra/"). Their content is asserted by the graph tests in
``tests/infra``.
"""
