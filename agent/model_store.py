"""Model store: fetch the pool's model from the stack's bucket into the node's cache before the engine starts.

Reads the manifest (`fleet.protocol.model_manifest`), downloads each file into the cache and checks its sha256, then the
engine loads the local directory. Node cache layout (``cache_dir`` is ``/models/store`` in engine pods)::

    <cache_dir>/<model id>/<revision>/                 the model: dirs 0555, files 0444 once complete
    <cache_dir>/<model id>/<revision>.lock             fcntl lock: one fetcher per model on the node
    <cache_dir>/<model id>/<revision>.manifest.json    the verified manifest, written last: "complete"

* Parallel: a file above ``part_size`` (``modelStore.partSizeMib``) is fetched as ranged GETs, ``concurrency``
  (``modelStore.concurrency``) at a time, each written at its offset into the preallocated partial
  (`agent.ranged_fetch`); smaller files are one GET each, one after the other.
* Resumable: a file is downloaded to ``<path>.partial`` and renamed into place only once its sha256 matches. When an
  agent restarts mid-download, a small file continues from the partial's length (an HTTP Range request), a large
  one fetches only the ranges its sidecar ``.<name>.partial.parts`` does not list as complete. The sha256 is computed
  over the whole file once its last part has landed.
* A checksum mismatch discards the file and downloads it once more from byte 0; a second mismatch fails the fetch
  with `ChecksumError`, naming the file.
* Agents sharing a node's cache take the lock in turn: the second waits, then finds the marker equal to the
  store's manifest and downloads nothing. The read-only files keep an engine from changing a shared model.
* ``hub_fallback`` (the stack's ``modelStore.hubFallback``): any `FetchError` is logged and the engine loads the
  model from the Hugging Face Hub instead; otherwise the error fails the fetch.

`ModelFetcher.fetch` blocks (boto3, hashing): the agent runs it in a worker thread and calls `cancel` on a drain;
every download and the hashing of a large file stop at the next 1 MiB chunk. ``llmfleet_agent_model_fetched_bytes``
counts the bytes as they arrive, from every part.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent.metrics import AgentMetrics
from agent.ranged_fetch import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PART_SIZE,
    FetchCancelled,
    FetchError,
    RangedObject,
    discard,
    fetch_ranges,
    hash_partial,
    sidecar_path,
)
from fleet.protocol.model_manifest import PARTIAL_SUFFIX, Manifest, ManifestError, ManifestFile, ModelKeys, sha256_file

__all__ = ["ChecksumError", "FetchCancelled", "FetchError", "FetchResult", "ModelFetcher", "StoreOptions"]

log = logging.getLogger(__name__)
_CHUNK = 1024 * 1024


class ChecksumError(FetchError):
    """A file's sha256 differed from the manifest's twice in a row (a corrupt or changing object)."""


@dataclass(frozen=True)
class StoreOptions:
    """Where this agent's model store is: the bucket (``LLMFLEET_MODEL_BUCKET``), the stack's ``modelStore``
    settings, and the node cache folder (``LLMFLEET_MODEL_CACHE``)."""

    bucket: str
    prefix: str
    cache_dir: Path
    hub_fallback: bool = False
    region: str | None = None  # None: boto3's own default (AWS_REGION in a pod with an IRSA role)
    concurrency: int = DEFAULT_CONCURRENCY  # ranged GETs in flight for one large file
    part_size: int = DEFAULT_PART_SIZE  # bytes per ranged GET; files up to this size take one GET


@dataclass(frozen=True)
class FetchResult:
    model_dir: Path | None  # what the engine loads; None: the pool's model id, from the Hub
    source: Literal["downloaded", "cached", "hub"]
    bytes_fetched: int


class ModelFetcher:
    """One model revision from ``bucket`` (``client``: a boto3 S3 client, thread-safe, with a connection pool of
    at least ``concurrency``) into ``cache_dir``."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        keys: ModelKeys,
        cache_dir: Path,
        metrics: AgentMetrics,
        *,
        hub_fallback: bool = False,
        lock_poll_s: float = 0.2,
        concurrency: int = DEFAULT_CONCURRENCY,
        part_size: int = DEFAULT_PART_SIZE,
    ) -> None:
        self.client, self.bucket, self.keys, self.metrics = client, bucket, keys, metrics
        self.hub_fallback = hub_fallback
        self.concurrency, self.part_size = concurrency, part_size
        self.model_dir = cache_dir / keys.model / keys.revision
        self._marker = self.model_dir.with_name(f"{keys.revision}.manifest.json")
        self._lock_path = self.model_dir.with_name(f"{keys.revision}.lock")
        self._lock_poll_s = lock_poll_s
        self._cancelled = threading.Event()
        self.phase = "idle"  # for /status: idle, manifest, waiting_for_lock, downloading, done, failed
        self.bytes_fetched = 0
        self._count_lock = threading.Lock()  # parts add to bytes_fetched from the pool's threads

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def cancel(self) -> None:
        self._cancelled.set()

    def fetch(self) -> FetchResult:
        """Make the model complete in the cache; FetchError (never with ``hub_fallback``), FetchCancelled."""
        started = time.monotonic()
        try:
            try:
                result = self._fetch()
            except OSError as exc:  # the node's disk: full, read-only, owned by someone else
                raise FetchError(f"model cache {self.model_dir}: {exc}") from exc
        except FetchError as exc:
            self.phase = "failed"
            if not self.hub_fallback:
                self.metrics.model_fetches.labels("failed").inc()
                raise
            log.warning("%s; loading %s from the Hugging Face Hub (modelStore.hubFallback)", exc, self.keys.model)
            result = FetchResult(None, "hub", self.bytes_fetched)
        finally:
            self.metrics.model_fetch_seconds.set(time.monotonic() - started)
        self.phase = "done"
        self.metrics.model_fetches.labels(result.source).inc()
        return result

    def _fetch(self) -> FetchResult:
        self.phase = "manifest"
        try:
            remote = self._remote_manifest()
        except FetchError as exc:
            if self._complete(self._local_manifest()):  # the store is down or lost it: the verified copy still is
                log.warning("%s; using the verified copy in %s", exc, self.model_dir)
                return FetchResult(self.model_dir, "cached", 0)
            raise
        with self._locked():
            local = self._local_manifest()
            if local == remote and self._complete(local):
                log.info("%s revision %s is complete in %s", self.keys.model, self.keys.revision, self.model_dir)
                return FetchResult(self.model_dir, "cached", 0)
            self.phase = "downloading"
            self._marker.unlink(missing_ok=True)
            _set_modes(self.model_dir, files=0o644, dirs=0o755)
            trusted = {f.path: f for f in local.files} if local is not None else {}
            for entry in remote.files:
                self._place(entry, trusted.get(entry.path) == entry)
            self._remove_strays(remote)
            _set_modes(self.model_dir, files=0o444, dirs=0o555)  # the engine must not change a shared model
            staging = self._marker.with_name(self._marker.name + ".tmp")
            staging.write_bytes(remote.to_json())
            os.replace(staging, self._marker)
        log.info("fetched %s revision %s: %d bytes", self.keys.model, self.keys.revision, self.bytes_fetched)
        return FetchResult(self.model_dir, "downloaded", self.bytes_fetched)

    def _remote_manifest(self) -> Manifest:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self.keys.manifest
        try:
            data = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise FetchError(
                    f"{self.keys.model} revision {self.keys.revision} is not in the model store ({self.url(key)} "
                    "is missing): push it with `llmfleet model push`, or set modelStore.hubFallback"
                ) from None
            raise FetchError(f"{self.url(key)}: {exc}") from None
        except BotoCoreError as exc:
            raise FetchError(f"{self.url(key)}: {exc}") from None
        try:
            manifest = Manifest.parse(data, self.url(key))
        except ManifestError as exc:
            raise FetchError(str(exc)) from None
        if (manifest.model, manifest.revision) != (self.keys.model, self.keys.revision):
            raise FetchError(f"{self.url(key)} describes {manifest.model} revision {manifest.revision}")
        return manifest

    def _local_manifest(self) -> Manifest | None:
        try:
            return Manifest.parse(self._marker.read_bytes(), str(self._marker))
        except (OSError, ManifestError):
            return None

    def _complete(self, manifest: Manifest | None) -> bool:
        """Marker present and every file in place with its size (verified when the marker was written)."""
        if manifest is None:
            return False
        return all(_size(self.model_dir / f.path) == f.size for f in manifest.files)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock_path.open("a+b") as handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self.phase != "waiting_for_lock":
                        log.info("another agent is fetching %s; waiting for %s", self.keys.model, self._lock_path)
                        self.phase = "waiting_for_lock"
                    if self._cancelled.wait(self._lock_poll_s):
                        raise FetchCancelled() from None
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _place(self, entry: ManifestFile, trusted: bool) -> None:
        """Put ``entry`` in the model directory, verified; ``trusted``: the previous marker vouches for it."""
        final = self.model_dir / entry.path
        if final.exists():
            if (trusted and _size(final) == entry.size) or sha256_file(final).hexdigest() == entry.sha256:
                return
            final.unlink()
        for attempt in (1, 2):
            got = self._download(entry, final)
            if got == entry.sha256:
                self.metrics.model_files_verified.inc()
                return
            self.metrics.model_checksum_failures.inc()
            discard(final.with_name(final.name + PARTIAL_SUFFIX))
            log.warning("%s: sha256 %s, manifest says %s (attempt %d of 2)", entry.path, got, entry.sha256, attempt)
        raise ChecksumError(
            f"{entry.path}: sha256 does not match the manifest after two downloads of "
            f"{self.url(self.keys.file(entry.path))} (expected {entry.sha256}, got {got})"
        )

    def _download(self, entry: ManifestFile, final: Path) -> str:
        """Fetch ``<final>.partial``; rename it to ``final`` when its sha256 matches; the digest."""
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        partial.parent.mkdir(parents=True, exist_ok=True)
        if entry.size > self.part_size:
            key = self.keys.file(entry.path)
            obj = RangedObject(self.client, self.bucket, key, entry.size, entry.sha256, entry.path)
            fetch_ranges(
                obj,
                partial,
                part_size=self.part_size,
                concurrency=self.concurrency,
                cancelled=self._cancelled,
                on_bytes=self._count,
            )
            got = hash_partial(partial, self._cancelled)
        else:
            got = self._download_stream(entry, partial)
        if got == entry.sha256:
            os.replace(partial, final)
            sidecar_path(partial).unlink(missing_ok=True)
        return got

    def _download_stream(self, entry: ManifestFile, partial: Path) -> str:
        """Continue ``partial`` from its length in one GET; its digest."""
        from botocore.exceptions import BotoCoreError, ClientError

        if sidecar_path(partial).exists():  # left by a ranged fetch (a larger part size): not a prefix
            discard(partial)
        offset = _size(partial) or 0
        if offset > entry.size:  # not a prefix of this file: start over
            partial.unlink()
            offset = 0
        digest = sha256_file(partial) if offset else hashlib.sha256()
        key = self.keys.file(entry.path)
        with partial.open("ab") as out:
            if offset < entry.size:
                ranged = {"Range": f"bytes={offset}-"} if offset else {}
                try:
                    body = self.client.get_object(Bucket=self.bucket, Key=key, **ranged)["Body"]
                    for chunk in body.iter_chunks(_CHUNK):
                        if self._cancelled.is_set():
                            raise FetchCancelled()
                        out.write(chunk)
                        digest.update(chunk)
                        self._count(len(chunk))
                except (BotoCoreError, ClientError) as exc:
                    raise FetchError(f"{entry.path}: {self.url(key)}: {exc}") from None
                log.info("fetched %s (%d bytes from offset %d)", entry.path, entry.size - offset, offset)
        return digest.hexdigest()

    def _count(self, n: int) -> None:
        with self._count_lock:
            self.bytes_fetched += n
        self.metrics.model_fetched_bytes.inc(n)

    def _remove_strays(self, manifest: Manifest) -> None:
        """Files the manifest does not list (a re-pushed revision's old shards, stale partials) would confuse vLLM."""
        wanted = {self.model_dir / f.path for f in manifest.files}
        for path in sorted(self.model_dir.rglob("*"), reverse=True):
            if path.is_file() and path not in wanted:
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _set_modes(root: Path, *, files: int, dirs: int) -> None:
    """chmod ``root``, every folder under it to ``dirs`` and every file to ``files`` (chmod needs ownership, not
    write access to the parent, so the order does not matter)."""
    if not root.exists():
        return
    root.chmod(dirs)
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod(dirs if path.is_dir() else files)
