"""Response ids: the id a client gets for a response names the replica that holds it and the tenant it belongs to.

vLLM keeps a stored response (``engine.responsesStore``) in the memory of the engine that made it, so a follow-up
(``previous_response_id``), ``GET /v1/responses/{id}`` and ``cancel`` must reach that replica. The gateway hands
out its own id instead of the engine's: ``resp_<payload>.<tag>``, where the payload is the replica's id and the
engine's response id (base64url) and the tag a MAC over the payload and the tenant's name. Any gateway of the
fleet opens it with no shared state and no store of its own (a follow-up may come through another gateway, or
after a gateway restart), and a tenant that presents another tenant's id, or an id it altered, gets the same 404
as for an id that never existed.

The MAC key is derived from the engines' API key, which every gateway of a fleet holds (``engines:apiKey`` on a
cluster; ``llmfleet up`` makes one per fleet). A gateway without one makes a key of its own at start: its ids are
good on that gateway until it restarts, and it logs so.

`IdRewriter` turns the engine's ids into the gateway's in whatever the engine answers (a JSON body, SSE events,
an error message), by replacing the exact engine id bytes: an engine's response id is random and occurs nowhere
else in its answer.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
from dataclasses import dataclass

__all__ = ["Held", "IdRewriter", "ResponseIds"]

log = logging.getLogger("llmfleet.gateway")

_PREFIX = "resp_"
_TAG_BYTES = 16
_ENGINE_ID = re.compile(rb'"id":\s*"(resp_[^"\\]{1,200})"')  # the response object's own id ("id" is not a suffix)


@dataclass(frozen=True)
class Held:
    """Where a response lives: the replica's id and the id its engine gave it."""

    replica: str
    engine_id: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ResponseIds:
    """Seals and opens the gateway's response ids (see the module's docstring)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_engine_key(cls, engine_api_key: str | None) -> ResponseIds:
        if not engine_api_key:
            log.warning("no engine API key: response ids are good on this gateway only, until it restarts")
            return cls(os.urandom(32))
        return cls(hmac.new(engine_api_key.encode(), b"llmfleet response ids", hashlib.sha256).digest())

    def _tag(self, payload: bytes, tenant: str) -> bytes:
        return hmac.new(self._key, tenant.encode() + b"\n" + payload, hashlib.sha256).digest()[:_TAG_BYTES]

    def seal(self, held: Held, tenant: str) -> str:
        payload = held.replica.encode() + b"\n" + held.engine_id.encode()
        return f"{_PREFIX}{_b64(payload)}.{_b64(self._tag(payload, tenant))}"

    def open(self, public_id: str, tenant: str) -> Held | None:
        """Where ``public_id`` lives, when ``tenant`` was given it by a gateway of this fleet; else None."""
        body, _, tag = public_id.removeprefix(_PREFIX).partition(".")
        if not public_id.startswith(_PREFIX) or not body or not tag:
            return None
        try:
            payload, presented = _unb64(body), _unb64(tag)
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(presented, self._tag(payload, tenant)):
            return None
        replica, _, engine_id = payload.decode("utf-8", "replace").partition("\n")
        return Held(replica, engine_id) if replica and engine_id else None


class IdRewriter:
    """Rewrites one engine answer's response ids to the gateway's, chunk by chunk.

    ``known`` maps engine ids already known (the follow-up's previous response, the id a GET names) to the ids the
    client used; the answer's own id is learned from the first ``"id": "resp_..."`` it holds (a response object's
    first field), sealed for ``replica`` and ``tenant``. A chunk never splits an id: the relay passes whole events.
    """

    def __init__(self, ids: ResponseIds, replica: str, tenant: str, known: dict[str, str] | None = None) -> None:
        self.ids, self.replica, self.tenant = ids, replica, tenant
        self._swaps = [(engine.encode(), public.encode()) for engine, public in (known or {}).items()]
        self._learned = False

    def __call__(self, chunk: bytes) -> bytes:
        if not self._learned:
            found = _ENGINE_ID.search(chunk)
            if found is not None:
                engine_id = found.group(1).decode()
                if all(engine != found.group(1) for engine, _ in self._swaps):
                    sealed = self.ids.seal(Held(self.replica, engine_id), self.tenant)
                    self._swaps.append((found.group(1), sealed.encode()))
                self._learned = True
        for engine, public_id in self._swaps:
            chunk = chunk.replace(engine, public_id)
        return chunk
