"""AliasSync: keep the gateway's alias weights what the control plane says they are now.

    gateway -> control plane   GET /v1/aliases   fleet.protocol.wire.AliasWeights, every routing.scrapeIntervalS

Canary rollouts move an alias's weights in the control plane (`control_plane.rollouts`); each gateway reads them
with its discovery and swaps its table (`gateway.models.Models.set_aliases`) when they changed, so every
gateway sends the same share of the alias to the candidate within one interval. Until the first answer, and
whenever the control plane cannot be reached (or is older and has no such endpoint), the table in use stays:
the stack's at start, the last one read after.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from fleet.protocol.control_auth import ClientCredential
from fleet.protocol.wire import AliasWeights
from gateway.routing.aliases import AliasTable, WeightedAlias

__all__ = ["AliasSync", "table_of"]

log = logging.getLogger("llmfleet.gateway.aliases")


def table_of(weights: AliasWeights) -> AliasTable:
    """The `AliasTable` an `AliasWeights` answer describes; ValueError when an alias is not servable."""
    return AliasTable(
        {
            name: WeightedAlias(name, dict(entry.pools), entry.fallback, entry.sticky == "session")
            for name, entry in weights.aliases.items()
        }
    )


class AliasSync:
    """Polls ``GET /v1/aliases`` and hands each changed table to ``apply`` (which may refuse it with ValueError)."""

    def __init__(
        self,
        control_plane: str,
        session: aiohttp.ClientSession,
        apply: Callable[[AliasTable], None],
        interval_s: float,
        timeout_s: float = 2.0,
        credential: ClientCredential | None = None,
    ) -> None:
        self.url = control_plane.rstrip("/") + "/v1/aliases"
        self.credential = credential  # the gateway's control credential (None: sends none, for --auth none)
        self.session = session
        self.apply = apply
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.last: AliasWeights | None = None  # the last answer applied
        self._failing = False

    async def sync_once(self) -> bool:
        """Read the weights and apply them if they changed; True when the table was replaced."""
        try:
            headers = self.credential.headers() if self.credential is not None else None
            async with self.session.get(self.url, timeout=self.timeout, headers=headers) as resp:
                resp.raise_for_status()
                weights = AliasWeights.model_validate_json(await resp.read())
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:  # OSError: an unreadable token file
            if not self._failing:
                log.warning("alias weights from %s unavailable (%s): keeping the current ones", self.url, exc)
            self._failing = True
            return False
        self._failing = False
        if self.last is not None and weights.aliases == self.last.aliases:
            return False
        try:
            self.apply(table_of(weights))
        except ValueError as exc:
            log.error("alias weights from %s refused: %s", self.url, exc)
            return False
        changed = {name: dict(entry.pools) for name, entry in weights.aliases.items()}
        log.info("alias weights now %s", changed)
        self.last = weights
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.sync_once()
