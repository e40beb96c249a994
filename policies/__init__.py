"""policies: the llmfleet CrossGuard policy pack. Rules live in one module per concern, one function each.

`policies.pack.POLICIES` lists them; `policies/__main__.py` only hands that list to ``PolicyPack`` (which
serves the pack to the Pulumi engine and never returns, so nothing else imports it).
"""
