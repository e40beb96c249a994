"""llmfleet core: the fleet spec, its catalogues, the capacity model and the CLI."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
