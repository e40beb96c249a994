"""Local fleet: ``llmfleet up`` (run every part on this machine), ``status`` and ``load``."""
