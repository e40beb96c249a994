"""Block hash: vLLM 0.33's default prefix-cache block hash (``sha256``), the one its KV events carry.

The recurrence (``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens`` and ``init_none_hash``;
``vllm/utils/hashing.py`` ``sha256``)::

    sha256(x)  = SHA-256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))
    NONE_HASH  = sha256(seed)                    seed: $PYTHONHASHSEED if set, else "vllm-none-hash"
    H_k        = sha256((H_{k-1} or NONE_HASH, tuple(tokens of block k), extra_keys or None))
    extra_keys = (("cache_salt", salt),) for block 0 of a request with a ``cache_salt`` (0.31+), else None

Each ``H`` is the 32-byte digest (``bytes``), and the parent enters the tuple as those bytes. Events publish
``int.from_bytes(H, "big") & (2**64 - 1)`` (the low 64 bits) while ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` is
1, its default, else the digest itself (`external_hash`). The simulator keys its own prefix cache with a cheaper
hash (`engine_sim.kv`) and computes these only for the blocks it publishes, when KV events are on.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "chain_hashes",
    "external_hash",
    "extra_keys",
    "hash_block_tokens",
    "none_hash",
    "sha256",
]

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # vLLM's seed for sha256 when PYTHONHASHSEED is unset
_LOW_64 = (1 << 64) - 1


def sha256(value: object) -> bytes:
    """SHA-256 of the value's pickle at the highest protocol, vLLM's ``sha256`` hash function."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def none_hash(seed: str = DEFAULT_NONE_HASH_SEED) -> bytes:
    """The root every chain starts from: the hash of the seed string."""
    return sha256(seed)


def extra_keys(block: int, cache_salt: str | None) -> tuple[tuple[str, str], ...] | None:
    """Block ``block``'s extra keys as vLLM 0.31+ tags them (``generate_block_hash_extra_keys``): the salt, on the
    first block only (every later block inherits it through its parent); no LoRA or multimodal keys here."""
    return (("cache_salt", cache_salt),) if block == 0 and cache_salt else None


def hash_block_tokens(
    root: bytes, parent: bytes | None, tokens: Sequence[int], extra: tuple[object, ...] | None = None
) -> bytes:
    """One block's digest: its parent's (``root`` for the first block), its tokens and its extra keys."""
    return sha256((parent or root, tuple(tokens), extra))


def chain_hashes(
    root: bytes, token_ids: Sequence[int], block_size: int, done: list[bytes], cache_salt: str | None = None
) -> list[bytes]:
    """Extend ``done`` (the digests of the first full blocks) to every full block of ``token_ids``, of a request
    with ``cache_salt``; returns it."""
    for k in range(len(done), len(token_ids) // block_size):
        tokens = token_ids[k * block_size : (k + 1) * block_size]
        done.append(hash_block_tokens(root, done[k - 1] if k else None, tokens, extra_keys(k, cache_salt)))
    return done


def external_hash(digest: bytes, as_int: bool = True) -> int | bytes:
    """The hash as events carry it: the digest's low 64 bits as an unsigned int, or the raw digest."""
    return int.from_bytes(digest, "big") & _LOW_64 if as_int else digest
