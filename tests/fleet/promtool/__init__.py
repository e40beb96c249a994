"""Promtool unit tests of the SLO rules (`fleet.slo_rules`), built from scenarios of synthetic series."""
