"""Quota: per-tenant requests/s, tokens/min and concurrency, in memory or shared through Redis.

Both backends implement `QuotaBackend` with the same semantics (see `gateway.quota.base`):
reserve at admission (one request, prompt + max_tokens tokens, one concurrency slot) all-or-nothing, so a
rejected request consumes nothing; reconcile at the end with the tokens actually used.
"""

from __future__ import annotations

from gateway.quota.base import QuotaBackend, QuotaLimits, Reservation, check_fits
from gateway.quota.memory import MemoryQuota

__all__ = ["MemoryQuota", "QuotaBackend", "QuotaLimits", "Reservation", "check_fits"]
