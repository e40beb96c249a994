"""``python -m engine_sim serve MODEL [flags]``: the same as ``llmfleet sim serve``."""

from __future__ import annotations

from engine_sim.cli import main

raise SystemExit(main())
