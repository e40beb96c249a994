"""Shares: this gateway's part of each pool's admission capacity, as the control plane last divided it.

With several gateways in front of one pool, each admitting the pool's whole capacity would put N times the load
into the engines' own first-come queues, where priority and tenant fairness no longer hold. So the control plane
answers each gateway report with the gateway's share (`control_plane.shares`), and the gateway admits
``capacity(pool, full)`` = ``full`` x its share, rounded to the nearest, at least 1 while ``full`` > 0 (so
the gateways together may admit up to N/2 slots more than ``full``: rounding down would leave a gateway whose share
grew by a high-priority request's worth, 0.5 of a slot say, without the slot it needs).

* No control plane configured: the gateway is alone by construction, its share is 1.
* A share is trusted for ``hold_s`` (the control plane's ``staleAfterS``) after it arrived; then, and before the
  first one arrives, the gateway falls back to ``floor`` (1 / ``gateway.replicas``): the share it would get from
  an even split among the gateways the stack asks for. The floor needs no peer to answer; it is wrong by the
  ratio of running to configured gateways (during a rollout surge, or with a pod missing).
The request path never waits on the control plane: a share is applied when a report's answer arrives.
"""

from __future__ import annotations

from collections.abc import Callable

from fleet.protocol.clock import Clock

__all__ = ["CapacityShares"]


class CapacityShares:
    def __init__(
        self,
        *,
        controlled: bool,
        floor: float,
        hold_s: float,
        clock: Clock,
        on_change: Callable[[str], None] = lambda pool: None,
    ) -> None:
        """``controlled``: a control plane divides capacity (else every share is 1); ``floor`` in (0, 1];
        ``on_change(pool)`` is called when a pool's share changes, to re-apply the capacity."""
        self.controlled = controlled
        self.floor = floor
        self.hold_s = hold_s
        self._clock = clock
        self._on_change = on_change
        self._shares: dict[str, tuple[float, float]] = {}  # pool -> (share, received at)

    def update(self, pool: str, share: float | None) -> None:
        """Record the share the control plane just gave for ``pool`` (None: it knows no capacity; keep the floor)."""
        if share is None:
            return
        previous = self.share(pool)
        self._shares[pool] = (min(1.0, max(0.0, share)), self._clock.monotonic())
        if self.share(pool) != previous:
            self._on_change(pool)

    def known(self, pool: str) -> bool:
        """Whether a share from the control plane is held for ``pool`` (not the floor)."""
        held = self._shares.get(pool)
        return self.controlled and held is not None and self._clock.monotonic() - held[1] <= self.hold_s

    def share(self, pool: str) -> float:
        """The fraction of ``pool``'s capacity this gateway may admit now."""
        if not self.controlled:
            return 1.0
        return self._shares[pool][0] if self.known(pool) else self.floor

    def capacity(self, pool: str, full: int) -> int:
        """This gateway's admission capacity for ``pool`` when the whole pool admits ``full``."""
        if full <= 0:
            return 0
        return max(1, int(full * self.share(pool) + 0.5))
