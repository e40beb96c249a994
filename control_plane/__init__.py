"""Autoscaler: the control plane (reports, discovery, leases) and the scaling loop (policies, actuators)."""
