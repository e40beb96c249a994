"""KV index: which replica's engine holds which prefix block, from the engines' own KV-cache events.

Fed by `gateway.kv_events` with the decoded events of each replica's stream (vLLM 0.33's map-encoded
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``), read by the ``kv-cache`` scorer. Pure: no I/O, no clock.

Two key spaces, as llm-d's and Dynamo's indexers keep them:

* **engine keys**: the events' ``block_hashes``, opaque ids used only to find a block again (its removal, a later
  block's ``parent_block_hash``), per replica;
* **request keys**: this index's own chain over the events' ``token_ids``,
  ``key_k = hash((key_{k-1}, tokens of block k))`` from a root per LoRA adapter and ``cache_salt``, so neither the
  engine's hash algorithm nor its seed has to match. A request's keys are the same chain over its prompt's full
  blocks from the root of its adapter and the salt it is sent with, so a key stands for the whole prefix up to its
  block, as cached under that salt.

**Salts.** vLLM (0.31+) hashes block 0 with the extra key ``("cache_salt", salt)``, so a salted prefix is another
prefix. Its events publish the salt untagged in block 0's entry of ``extra_keys``: ``[[salt], null, ...]``, after
the LoRA name when ``lora_name`` is set (``[name, salt]``) and after any multimodal ``[identifier, offset]`` pairs;
`event_salt` takes the first bare string after the LoRA name. The root of a chain stored with no parent takes that
salt, so tenant A's request (sent with A's salt) matches only blocks stored under A's salt.

Python's ``hash`` of a tuple of ints is the same in every process, but the root mixes in the adapter's name (a
str, whose hash varies per process): keys mean nothing outside the gateway that computed them, and need not.
Gateways agree because they read the same events, not because they share keys.

**Block size.** A request's keys cut its prompt into blocks of the engines' size, so the index must know it. Pinned
(``block_size`` given), events of another size are skipped. Left None (the default), it is learned: the size of
the first block indexed, and again of the next one whenever the index holds no block (a pool redeployed with
another ``--block-size`` is followed once the old replicas are gone). While blocks of one size are held, a
replica reporting another (a pool whose replicas disagree) has its blocks skipped: the first size stays.
vLLM's own default differs by platform (16 on GPUs; 128 on the CPU, which refuses 16), and nothing else tells the
gateway which one its engines use.

**Skipped blocks**, counted in ``skipped`` by reason (`SKIP_REASONS`), so that the feed can export and log them:

* ``parent``: a ``BlockStored`` whose parent this index never saw (its stream was cut, or it joined mid-chain): a
  prefix match walks from the root, so a chain without its start cannot match. Routine after a (re)connect;
* ``medium``: cached on another medium than the GPU (CPU offload);
* ``block_size``: another size than the index's (above);
* ``malformed``: ``token_ids`` that do not fill the blocks named, or a size below 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SKIP_REASONS", "KvIndex", "event_salt", "request_keys"]

_ROOT = 0x6C6C6D666C656574  # the chain's start for the base model
SKIP_REASONS = ("parent", "medium", "block_size", "malformed")  # why a stored block was not indexed


def _root(lora_name: str | None, cache_salt: str | None = None) -> int:
    if lora_name is None and not cache_salt:
        return _ROOT
    return hash((_ROOT, lora_name, cache_salt or None))


def event_salt(event: Mapping[str, Any]) -> str | None:
    """The ``cache_salt`` of a ``BlockStored``'s first block: the first bare string of ``extra_keys[0]`` after
    the LoRA name (present when ``lora_name`` is set); None when it carries none."""
    extra = event.get("extra_keys")
    if not isinstance(extra, list | tuple) or not extra or not isinstance(extra[0], list | tuple):
        return None
    entries = list(extra[0])
    if event.get("lora_name") is not None and entries and entries[0] == event.get("lora_name"):
        entries = entries[1:]
    for entry in entries:
        if isinstance(entry, str):
            return entry or None
    return None


def request_keys(
    token_ids: Sequence[int], block_size: int, lora_name: str | None = None, cache_salt: str | None = None
) -> list[int]:
    """The request keys of ``token_ids``'s full blocks of ``block_size`` tokens (a partial last block has none),
    for a request of adapter ``lora_name`` sent with ``cache_salt``."""
    keys: list[int] = []
    parent = _root(lora_name, cache_salt)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        keys.append(parent)
    return keys


@dataclass
class _Replica:
    blocks: dict[Any, int] = field(default_factory=dict)  # engine key -> request key
    refs: dict[int, int] = field(default_factory=dict)  # request key -> engine keys naming it (salted twins)

    def drop(self, engine_key: Any) -> int | None:
        """Forget ``engine_key``; its request key when no other engine key of this replica names it."""
        key = self.blocks.pop(engine_key, None)
        if key is None:
            return None
        self.refs[key] -= 1
        if self.refs[key]:
            return None
        del self.refs[key]
        return key


@dataclass
class KvIndex:
    """The blocks each replica's engine holds, by request key.

    ``block_size``: the engines' ``--block-size``, pinned; None (the default) learns it from the events (module
    docstring), and stays None until a block is indexed. Invariant: every block held is of ``block_size`` tokens.
    """

    block_size: int | None = None
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))  # blocks, by reason
    reported: dict[str, int] = field(default_factory=dict)  # replica -> block size of its last GPU BlockStored
    _pinned: bool = field(init=False)
    _replicas: dict[str, _Replica] = field(default_factory=dict)
    _holders: dict[int, set[str]] = field(default_factory=dict)  # request key -> replicas holding it

    def __post_init__(self) -> None:
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block size {self.block_size}: give 1 or more, or None to learn it")
        self._pinned = self.block_size is not None

    @property
    def pinned(self) -> bool:
        """Whether ``block_size`` was given (else it is learned)."""
        return self._pinned

    def __len__(self) -> int:
        """Request keys some replica holds."""
        return len(self._holders)

    def replicas(self) -> frozenset[str]:
        """Replicas with at least one block indexed."""
        return frozenset(r for r, state in self._replicas.items() if state.blocks)

    def blocks_of(self, replica: str) -> int:
        state = self._replicas.get(replica)
        return 0 if state is None else len(state.blocks)

    def apply(self, replica: str, events: Iterable[Mapping[str, Any]]) -> None:
        """Apply one batch's events from ``replica``'s engine, in order. Unknown event types are ignored (a newer
        engine may add some); malformed fields raise ValueError for the caller to drop the batch."""
        for event in events:
            kind = event.get("type")
            if kind == "BlockStored":
                self._stored(replica, event)
            elif kind == "BlockRemoved":
                self._removed(replica, event.get("block_hashes") or ())
            elif kind == "AllBlocksCleared":
                self.forget(replica)

    def forget(self, replica: str) -> None:
        """Drop every block of ``replica`` (it left, restarted, slept, or its stream has a gap)."""
        self.reported.pop(replica, None)
        state = self._replicas.pop(replica, None)
        if state is None:
            return
        for key in state.refs:
            self._release(key, replica)

    def matched(self, keys: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """Leading ``keys`` (a request's, from `request_keys`) each of ``replicas`` holds, walking from the first."""
        counts = dict.fromkeys(replicas, 0)
        alive = set(counts)
        for key in keys:
            alive &= self._holders.get(key, set())
            if not alive:
                break
            for replica in alive:
                counts[replica] += 1
        return counts

    def _stored(self, replica: str, event: Mapping[str, Any]) -> None:
        hashes = list(event["block_hashes"])
        tokens = list(event["token_ids"])
        size = int(event["block_size"])
        if event.get("medium") not in (None, "GPU"):
            self._skip("medium", hashes)
            return
        if size < 1 or len(tokens) != size * len(hashes):
            self._skip("malformed", hashes)
            return
        self.reported[replica] = size
        if size != self.block_size:
            if self._pinned or self._holders:  # pinned, or blocks of the size learned are held: the first size stays
                self._skip("block_size", hashes)
                return
            self.block_size = size  # learned: nothing is held, so no key of another size is left behind
        state = self._replicas.setdefault(replica, _Replica())
        parent_hash = event.get("parent_block_hash")
        if parent_hash is None:
            parent = _root(event.get("lora_name"), event_salt(event))
        elif parent_hash in state.blocks:
            parent = state.blocks[parent_hash]
        else:
            self._skip("parent", hashes)
            return
        for i, engine_key in enumerate(hashes):
            parent = hash((parent, tuple(tokens[i * size : (i + 1) * size])))
            if state.blocks.get(engine_key) == parent:
                continue  # stored again (a reused block reported in full): already held
            released = state.drop(engine_key)
            if released is not None:
                self._release(released, replica)
            state.blocks[engine_key] = parent
            state.refs[parent] = state.refs.get(parent, 0) + 1
            self._holders.setdefault(parent, set()).add(replica)

    def _skip(self, reason: str, hashes: Sequence[Any]) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + len(hashes)

    def _removed(self, replica: str, hashes: Iterable[Any]) -> None:
        state = self._replicas.get(replica)
        if state is None:
            return
        for engine_key in hashes:
            key = state.drop(engine_key)
            if key is not None:
                self._release(key, replica)

    def _release(self, key: int, replica: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(replica)
            if not holders:
                del self._holders[key]
