"""Keys: the stored form of a tenant's API key, shared by the gateway's key ring and ``llmfleet hash-key``.

A stack file never holds a plain key, only ``sha256:<64 hex digits>`` (`hash_api_key`); the gateway hashes each
presented key the same way and compares digests. `DEMO_API_KEY` is the local stack's key: any other stack that
carries its hash is rejected by `fleet.spec.validate`.
"""

from __future__ import annotations

import hashlib

__all__ = ["DEMO_API_KEY", "hash_api_key"]

# The local stack's demo key. Local-only: any other stack carrying its hash is rejected.
DEMO_API_KEY = "sk-llmfleet-demo"


def hash_api_key(key: str) -> str:
    """The form in which keys are stored: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()
