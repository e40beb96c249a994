"""Tokenizer store: a pool's tokenizer fetched from the stack's model bucket, for the ``kv-cache`` scorer.

On a cluster the engines load their model from the model bucket (`fleet.protocol.model_manifest`: the manifest
lists every file with its size and sha256), the tokenizer with it, and a gateway pod has no tokenizer folder of
its own. So for each pool that needs one (`wanted`: the routing scores with ``kv-cache``, the engine publishes
``engine.kvEvents`` and ``engine.tokenizer`` is unset) the gateway reads the revision's manifest and downloads
only the files `fleet.tokenizer.load_tokenizer` reads (`fleet.tokenizer.TOKENIZER_FILES` the manifest lists;
``tokenizer.json`` must be among them) into ``<cache>/<model id>/<revision>/``, checks each one's sha256 against
the manifest and loads that folder: the bytes the engine's agent fetched, so both count the same tokens.

* A file already in the cache with the manifest's sha256 is not fetched again; a tokenizer file in the cache
  that the manifest does not list (left by an earlier push) is removed, so it cannot change the tokenization.
* Errors (`TokenizerStoreError`) name the bucket and key: no manifest (or, as S3 answers a role that may not list
  the bucket, 403 for a missing key), a manifest without ``tokenizer.json``, a checksum mismatch (a corrupt
  object or a push under way), a bucket that cannot be reached (`StoreUnreachable`: tried once, not once per
  pool, so that the gateway's start stays within its startup probe).
* What an error costs: never the gateway's start. The error is logged as a warning, the pool is routed by the
  other scorers, and ``llmfleet_gateway_prompt_tokens_available{pool}`` is 0 until a restart fetches it. A gateway
  that cannot serve at all is worse than one that routes a pool by load. (A pool's own ``engine.tokenizer`` folder
  that cannot be read still fails the start, `gateway.prompt_tokens`: that is the stack's mistake.)

Blocking (boto3, hashing, parsing ``tokenizer.json``): the CLI calls `store_tokenizers` before the event loop
starts.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.protocol.model_manifest import PARTIAL_SUFFIX, Manifest, ManifestError, ManifestFile, ModelKeys
from fleet.spec.stack import FleetSpec, PoolSpec
from fleet.tokenizer import TOKENIZER_FILE, TOKENIZER_FILES, ModelTokenizer, TokenizerError, load_tokenizer
from gateway.routing.scorers.kv_cache import KvCache

__all__ = [
    "StoreUnreachable",
    "TokenizerSource",
    "TokenizerStore",
    "TokenizerStoreError",
    "fetch_all",
    "store_tokenizers",
    "wanted",
]

log = logging.getLogger("llmfleet.gateway.tokenizer_store")
_CHUNK = 1024 * 1024
_MISSING = ("NoSuchKey", "404")
_DENIED = ("AccessDenied", "403")


class TokenizerStoreError(Exception):
    """A pool's tokenizer cannot be had from the model store; the message names the bucket and key."""


class StoreUnreachable(TokenizerStoreError):
    """The bucket did not answer (network, credentials): every other pool's fetch would fail the same way."""


@dataclass(frozen=True)
class TokenizerSource:
    """Where tokenizers come from: the model bucket (``$LLMFLEET_MODEL_BUCKET``), the stack's ``modelStore.prefix``,
    and the local folder they are cached in (``$LLMFLEET_TOKENIZER_CACHE``)."""

    bucket: str
    prefix: str
    cache_dir: Path
    region: str | None = None  # None: boto3's own default (AWS_REGION in a pod with an IRSA role)


def wanted(spec: FleetSpec) -> list[PoolSpec]:
    """The pools whose tokenizer comes from the model store: routed by kv-cache, with KV events, no folder."""
    if KvCache.name not in {s.name for s in spec.gateway.routing.scorers}:
        return []
    return [p for p in spec.pools if p.engine.kv_events and p.engine.tokenizer is None]


class TokenizerStore:
    """Tokenizer folders of model revisions in ``source.bucket`` (``client``: a boto3 S3 client)."""

    def __init__(self, client: Any, source: TokenizerSource) -> None:
        self.client, self.source = client, source

    def url(self, key: str) -> str:
        return f"s3://{self.source.bucket}/{key}"

    def fetch(self, model: str, revision: str) -> Path:
        """The local folder holding ``model``'s tokenizer files at ``revision``, each checked against the manifest;
        TokenizerStoreError (StoreUnreachable when the bucket does not answer)."""
        try:
            keys = ModelKeys(self.source.prefix, model, revision)
        except ValueError as exc:
            raise TokenizerStoreError(f"{model} revision {revision} cannot be in the model store: {exc}") from None
        manifest = self._manifest(keys)
        listed = {f.path: f for f in manifest.files if f.path in TOKENIZER_FILES}
        if TOKENIZER_FILE not in listed:
            raise TokenizerStoreError(
                f"{self.url(keys.manifest)} lists no {TOKENIZER_FILE}: the gateway tokenizes with a tokenizers file "
                f"only (push the model with its {TOKENIZER_FILE})"
            )
        folder = self.source.cache_dir / model / revision
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name in TOKENIZER_FILES:
                if name in listed:
                    self._place(keys, listed[name], folder / name)
                else:
                    (folder / name).unlink(missing_ok=True)
        except OSError as exc:  # the cache folder: full, read-only, someone else's
            raise TokenizerStoreError(f"tokenizer cache {folder}: {exc}") from None
        return folder

    def _get(self, key: str, missing: str = "") -> Any:
        """``get_object``'s body; TokenizerStoreError naming the key and what S3 said (``missing`` added when the key
        is not there), StoreUnreachable when the bucket does not answer."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client.get_object(Bucket=self.source.bucket, Key=key)["Body"]
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _MISSING:
                raise TokenizerStoreError(f"{self.url(key)} is missing{missing}") from None
            if code in _DENIED:
                raise TokenizerStoreError(
                    f"{self.url(key)}: access denied: missing{missing} (S3 answers 403 for a missing key to a role "
                    "that may not list the bucket), or the gateway's role may not read it"
                ) from None
            raise TokenizerStoreError(f"{self.url(key)}: {exc}") from None
        except BotoCoreError as exc:
            raise StoreUnreachable(f"cannot reach the model bucket {self.source.bucket}: {key}: {exc}") from None

    def _manifest(self, keys: ModelKeys) -> Manifest:
        from botocore.exceptions import BotoCoreError

        where = self.url(keys.manifest)
        pushed = f": {keys.model} revision {keys.revision} was not pushed (`llmfleet model push`)"
        body = self._get(keys.manifest, pushed)
        try:
            data = body.read()
        except BotoCoreError as exc:
            raise StoreUnreachable(f"cannot read {where}: {exc}") from None
        try:
            manifest = Manifest.parse(data, where)
        except ManifestError as exc:
            raise TokenizerStoreError(str(exc)) from None
        if (manifest.model, manifest.revision) != (keys.model, keys.revision):
            raise TokenizerStoreError(f"{where} describes {manifest.model} revision {manifest.revision}")
        return manifest

    def _place(self, keys: ModelKeys, entry: ManifestFile, final: Path) -> None:
        """``final`` with the manifest's bytes: kept when its sha256 matches, else downloaded and checked."""
        if final.is_file() and _sha256(final) == entry.sha256:
            return
        from botocore.exceptions import BotoCoreError

        key = keys.file(entry.path)
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        digest = hashlib.sha256()
        try:
            with partial.open("wb") as out:
                for chunk in self._get(key).iter_chunks(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
        except BotoCoreError as exc:
            partial.unlink(missing_ok=True)
            raise StoreUnreachable(f"cannot read {self.url(key)}: {exc}") from None
        except TokenizerStoreError:
            partial.unlink(missing_ok=True)
            raise
        if digest.hexdigest() != entry.sha256:
            partial.unlink()
            raise TokenizerStoreError(
                f"{self.url(key)}: sha256 {digest.hexdigest()}, but {self.url(keys.manifest)} says {entry.sha256} "
                "(a corrupt object, or a push under way: push the model again)"
            )
        os.replace(partial, final)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def store_tokenizers(spec: FleetSpec, source: TokenizerSource, client: Any = None) -> dict[str, ModelTokenizer]:
    """The tokenizers of `wanted` pools, by pool name, fetched from ``source`` (``client`` None: a boto3 client from
    boto3's own settings); a pool it cannot fetch or load is logged and left out (the module's docstring)."""
    pools = wanted(spec)
    if not pools:
        return {}
    store = TokenizerStore(_s3_client(source.region) if client is None else client, source)
    return fetch_all(store, pools)


def fetch_all(store: TokenizerStore, pools: Iterable[PoolSpec]) -> dict[str, ModelTokenizer]:
    """Each pool's tokenizer, fetched once per model revision; once the bucket is unreachable nothing more is tried."""
    loaded: dict[tuple[str, str], ModelTokenizer | TokenizerStoreError | TokenizerError] = {}
    unreachable: StoreUnreachable | None = None
    out: dict[str, ModelTokenizer] = {}
    for pool in pools:
        which = (pool.model, pool.model_revision)
        if which not in loaded:
            outcome = unreachable or _load(store, *which)
            if isinstance(outcome, StoreUnreachable):
                unreachable = outcome
            loaded[which] = outcome
        got = loaded[which]
        if isinstance(got, ModelTokenizer):
            out[pool.name] = got
            log.info(
                "pool %s: the tokenizer of %s revision %s from %s", pool.name, *which, store.url(store.source.prefix)
            )
        else:
            log.warning("pool %s: no prompt tokens, so kv-cache scores nothing for it: %s", pool.name, got)
    return out


def _load(store: TokenizerStore, model: str, revision: str) -> ModelTokenizer | TokenizerStoreError | TokenizerError:
    """The revision's tokenizer, or why there is none."""
    try:
        return load_tokenizer(store.fetch(model, revision))
    except (TokenizerStoreError, TokenizerError) as exc:
        return exc


def _s3_client(region: str | None) -> Any:
    import boto3  # only a gateway with a pool to fetch for pays for the import
    from botocore.config import Config

    # Short timeouts and few attempts: the fetch runs before the gateway listens, within its startup probe.
    config = Config(connect_timeout=5, read_timeout=10, retries={"mode": "standard", "total_max_attempts": 3})
    return boto3.client("s3", region_name=region, config=config)
