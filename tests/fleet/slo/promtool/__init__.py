"""Promtool unit tests of the SLO rules (`fleet.slo.rules`), built from scenarios of synthetic series."""
