"""KV events: vLLM 0.33's ``--kv-events-config``, its three event kinds, and the batch payload they travel in.

Config (``vllm/config/kv_events.py`` ``KVEventsConfig``): the flag takes one JSON object with these fields, and an
unknown field, a wrong type or bad JSON fails at startup as vLLM's argparse does (exit 2, naming the flag)::

    enable_kv_cache_events false   publisher null -> "zmq" if enabled else "null"   endpoint "tcp://*:5557"
    replay_endpoint null           buffer_steps 10000   hwm 100000   max_queue_size 100000   topic ""

Events (``vllm/distributed/kv_events.py``: msgspec structs with ``tag=True`` and ``omit_defaults``, so each is a
msgpack map whose first key is ``"type"``, and defaulted optional fields are left out)::

    {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h | None, "token_ids": [...],
     "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [...], "group_idx": 0,
     "kv_cache_spec_kind": "full_attention"}
    {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0}
    {"type": "AllBlocksCleared"}

``extra_keys`` has one entry per block, untagged (``to_event_extra_keys``): ``[salt]`` for the first block of a
request with a ``cache_salt``, null for every other block (vLLM publishes the list even when every entry is null).

The batch (``KVEventBatch``, ``array_like=True``) is the msgpack array ``[ts, events, data_parallel_rank]``; the
publisher fills the rank in (0 without data parallelism), so all three elements are present.

`KVEventLog` is where the block pool records events as they happen (`engine_sim.kv`); the engine takes them once
per step and hands a non-empty list to the publisher (`engine_sim.kv_publisher`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from engine_sim.block_hash import DEFAULT_NONE_HASH_SEED, external_hash, none_hash

__all__ = ["KVEvent", "KVEventLog", "KVEventSettings", "KVEventsConfig", "encode_batch", "parse_kv_events_config"]

KVEvent = dict[str, Any]  # one event map, keys in vLLM's field order
MEDIUM_GPU = "GPU"


class KVEventsConfig(BaseModel):
    """vLLM 0.33's ``KVEventsConfig``: the same fields, defaults and extra-field refusal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None  # None resolves as vLLM's __post_init__ does
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @model_validator(mode="after")
    def _resolve_publisher(self) -> KVEventsConfig:
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        return self

    @property
    def publishes(self) -> bool:
        """Whether a ZMQ publisher runs: events enabled and the ``zmq`` publisher chosen."""
        return self.enable_kv_cache_events and self.publisher == "zmq"


def parse_kv_events_config(text: str) -> KVEventsConfig:
    """The flag's argparse ``type``: JSON -> `KVEventsConfig`; ArgumentTypeError (exit 2) on any error."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc}") from None
    try:
        return KVEventsConfig.model_validate(value)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(f"invalid KVEventsConfig {text!r}: {exc}") from None


@dataclass(frozen=True)
class KVEventSettings:
    """What the engine needs to record events: the config and the hashing environment vLLM reads.

    ``hash_seed`` is ``$PYTHONHASHSEED`` when set (else vLLM's fixed seed); ``int_block_hashes`` is
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (default 1). The CLI reads both from the environment.
    """

    config: KVEventsConfig
    hash_seed: str = DEFAULT_NONE_HASH_SEED
    int_block_hashes: bool = True


@dataclass
class KVEventLog:
    """Events since the last `take`, in order; maps the pool's cache keys to the hashes events published.

    Invariant: a key is in the map exactly while the block stored under it is announced and not yet removed or
    cleared, so every ``BlockRemoved`` names a hash an earlier ``BlockStored`` carried since the last
    ``AllBlocksCleared``.
    """

    settings: KVEventSettings
    block_size: int = 16
    root: bytes = field(init=False)
    _pending: list[KVEvent] = field(default_factory=list, init=False)
    _published: dict[int, int | bytes] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.root = none_hash(self.settings.hash_seed)

    def _external(self, digest: bytes) -> int | bytes:
        return external_hash(digest, self.settings.int_block_hashes)

    def stored(
        self,
        keys: Sequence[int],
        digests: Sequence[bytes],
        parent: bytes | None,
        tokens: list[int],
        cache_salt: str | None = None,
    ) -> None:
        """A run of consecutive blocks became cached: their pool keys, digests, the digest before the run (None
        at the start of a sequence), the run's tokens and the request's ``cache_salt`` (on the first block)."""
        hashes = [self._external(d) for d in digests]
        self._published.update(zip(keys, hashes, strict=True))
        self._pending.append(
            {
                "type": "BlockStored",
                "block_hashes": hashes,
                "parent_block_hash": None if parent is None else self._external(parent),
                "token_ids": tokens,
                "block_size": self.block_size,
                "lora_id": None,
                "medium": MEDIUM_GPU,
                "lora_name": None,
                "extra_keys": [
                    [cache_salt] if parent is None and i == 0 and cache_salt else None for i in range(len(hashes))
                ],  # fmt: skip
                "group_idx": 0,
                # The KV-cache manager tags stored blocks with their group's spec (vllm/v1/core/kv_cache_manager.py,
                # 0.32 and 0.33); the sliding window is null for full attention, so omit_defaults leaves it out.
                "kv_cache_spec_kind": "full_attention",
            }
        )

    def removed(self, key: int) -> None:
        """The block cached under ``key`` was evicted (nothing when it was never announced)."""
        published = self._published.pop(key, None)
        if published is not None:
            self._pending.append(
                {"type": "BlockRemoved", "block_hashes": [published], "medium": MEDIUM_GPU, "group_idx": 0}
            )

    def cleared(self) -> None:
        """The prefix cache was reset: a consumer forgets every block, so nothing announced is left to remove."""
        self._published.clear()
        self._pending.append({"type": "AllBlocksCleared"})

    def take(self) -> list[KVEvent]:
        """The events recorded since the last call, oldest first; the log starts empty again."""
        events, self._pending = self._pending, []
        return events


def encode_batch(ts: float, events: list[KVEvent], data_parallel_rank: int = 0) -> bytes:
    """The msgpack payload of one batch: ``[ts, events, data_parallel_rank]``."""
    payload: bytes = msgpack.packb([ts, events, data_parallel_rank], use_bin_type=True)
    return payload
