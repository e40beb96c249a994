"""Agent: the on-node supervisor of one engine replica (launch, probe, drain, restart, report)."""
