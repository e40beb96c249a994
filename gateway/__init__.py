"""Gateway: the OpenAI-compatible front door of a fleet (auth, quotas, admission, routing, proxy)."""
