"""Ranged fetch: one large S3 object into its preallocated ``.partial`` file, in parts fetched concurrently.

The file is split into byte ranges of at most ``part_size``; a bounded pool of ``concurrency`` threads GETs them
(one ``Range: bytes=a-b`` request each) and writes each chunk at its offset (``os.pwrite``), so parts land in any
order. The sidecar ``.<file>.partial.parts`` next to the partial records each range once it is fully written::

    {"size": 15000000000, "sha256": "..."}      header: the manifest entry the partial belongs to
    0-16777216                                  one completed range per line, [start, end), appended
    33554432-50331648

* Resumable: after an agent restart only the ranges the sidecar does not list are fetched again. A sidecar whose
  header names another size or digest (a re-pushed file) is discarded with its partial. A partial without a
  sidecar (written by the sequential path) counts as a complete prefix of its length.
* Nothing here trusts the sidecar for correctness: the caller hashes the whole partial after the last part
  (``hash_partial``, sequentially) and compares it with the manifest. Data is not fsynced, since a partial only
  has to survive the agent's process, and a node crash that loses a recorded range shows up as a mismatch.
* A range whose body breaks off mid-stream (botocore retries a failed request, not a cut body) is fetched again
  from its start, three GETs at most; other errors fail at once.
* ``cancelled`` is checked before each GET and between 1 MiB chunks: `FetchCancelled` within a chunk, with every
  completed range recorded. The first failing part stops the others the same way, and its error is raised.
* The sidecar's name starts with a dot, which no manifest path may, so it cannot collide with a model file.

Defaults (``modelStore.concurrency`` 16, ``modelStore.partSizeMib`` 16): AWS suggests ranges of 8-16 MB and one
request per 85-90 MB/s wanted, about 15 for a 10 Gb/s NIC (S3 user guide, "Performance guidelines"); 16 MiB
divides ``llmfleet model push``'s 64 MiB upload parts, so no range straddles two of them. s3transfer's
``TransferConfig`` (10 threads, 8 MiB) stays below AWS's figure for one 10 Gb/s NIC. See docs/cloud.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PART_SIZE",
    "FetchCancelled",
    "FetchError",
    "RangedObject",
    "discard",
    "fetch_ranges",
    "hash_partial",
    "missing_ranges",
    "sidecar_path",
]

log = logging.getLogger(__name__)
MIB = 1024 * 1024
DEFAULT_CONCURRENCY = 16
DEFAULT_PART_SIZE = 16 * MIB
_CHUNK = MIB
_ATTEMPTS = 3  # GETs of one range whose body breaks off, before the fetch fails

Range = tuple[int, int]  # [start, end) in bytes


class FetchError(RuntimeError):
    """The store could not provide the model; the message names the object or file and why."""


class FetchCancelled(Exception):
    """`ModelFetcher.cancel` was called (a drain): the fetch stopped between two chunks; partial files stay."""


class _Stopped(Exception):
    """Another part failed first: this one gave up; the first failure is the one raised."""


class _BodyBroken(Exception):
    """A range's body broke off after its response began: worth another GET of that range."""


@dataclass(frozen=True)
class RangedObject:
    """One object to fetch: where it is, what the manifest says of it, and ``name`` for messages."""

    client: Any  # a boto3 S3 client (thread-safe; its pool should hold ``concurrency`` connections)
    bucket: str
    key: str
    size: int
    sha256: str
    name: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def sidecar_path(partial: Path) -> Path:
    return partial.with_name(f".{partial.name}.parts")


def discard(partial: Path) -> None:
    """Remove a partial file and its sidecar (a checksum mismatch, or a partial of another shape)."""
    partial.unlink(missing_ok=True)
    sidecar_path(partial).unlink(missing_ok=True)


def missing_ranges(size: int, done: Iterable[Range], part_size: int) -> list[Range]:
    """The ranges of ``[0, size)`` not covered by ``done``, cut at multiples of ``part_size`` (so that, as on a
    first fetch, every range lies within one upload part when the push used a multiple of it)."""
    missing: list[Range] = []
    cursor = 0
    for start, end in [*sorted(done), (size, size)]:
        while cursor < min(start, size):
            cut = min((cursor // part_size + 1) * part_size, start, size)
            missing.append((cursor, cut))
            cursor = cut
        cursor = max(cursor, end)
    return missing


def fetch_ranges(
    obj: RangedObject,
    partial: Path,
    *,
    part_size: int,
    concurrency: int,
    cancelled: threading.Event,
    on_bytes: Callable[[int], None],
) -> int:
    """Make every byte of ``partial`` fetched, resuming from its sidecar; the number of bytes fetched now.

    FetchError (the store failed, or answered a range with other bytes than asked), FetchCancelled, OSError."""
    partial.parent.mkdir(parents=True, exist_ok=True)
    done = _resume(obj, partial)
    todo = missing_ranges(obj.size, done, part_size)
    if not todo:
        return 0
    stop = threading.Event()  # set by the first failure, so the other parts give up between chunks
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # Reserve the whole file now: a full disk fails here, not 14 GB into the download.
        os.posix_fallocate(fd, 0, obj.size)
        record = os.open(sidecar_path(partial), os.O_WRONLY | os.O_APPEND)
        try:
            error = _run(obj, fd, record, todo, concurrency, cancelled, stop, on_bytes)
        finally:
            os.close(record)
    finally:
        os.close(fd)
    if error is not None:
        raise error
    fetched = sum(end - start for start, end in todo)
    log.info("fetched %s (%d bytes in %d ranges, %d at a time)", obj.name, fetched, len(todo), concurrency)
    return fetched


def hash_partial(partial: Path, cancelled: threading.Event) -> str:
    """The sha256 of ``partial``, read in order once every part has landed; FetchCancelled between chunks."""
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with partial.open("rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            if cancelled.is_set():
                raise FetchCancelled()
            digest.update(view[:n])
    return digest.hexdigest()


def _run(
    obj: RangedObject,
    fd: int,
    record: int,
    todo: list[Range],
    concurrency: int,
    cancelled: threading.Event,
    stop: threading.Event,
    on_bytes: Callable[[int], None],
) -> BaseException | None:
    """Fetch ``todo`` on a bounded pool, recording each completed range; the first failure, if any."""
    error: BaseException | None = None
    with ThreadPoolExecutor(max_workers=min(concurrency, len(todo)), thread_name_prefix="model-fetch") as pool:
        futures = {pool.submit(_fetch_range, obj, fd, part, cancelled, stop, on_bytes): part for part in todo}
        # Every future is waited for, so that ranges finished while another failed are still recorded.
        for future in as_completed(futures):
            exc = future.exception()
            if exc is None:
                start, end = futures[future]
                os.write(record, f"{start}-{end}\n".encode())  # one write per line: appends do not interleave
            elif error is None or isinstance(error, _Stopped):
                error = exc
                stop.set()
    return error


def _fetch_range(
    obj: RangedObject,
    fd: int,
    part: Range,
    cancelled: threading.Event,
    stop: threading.Event,
    on_bytes: Callable[[int], None],
) -> None:
    """GET one range into ``fd``, again from its start if the body breaks off (botocore retries the request
    itself, not a body cut mid-stream): at most `_ATTEMPTS` times, then FetchError."""
    start, end = part
    where = f"{obj.name}: {obj.url} bytes {start}-{end - 1}"
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            _get_range(obj, fd, part, where, cancelled, stop, on_bytes)
            return
        except _BodyBroken as exc:
            if attempt == _ATTEMPTS:
                raise FetchError(f"{where}: {exc} ({_ATTEMPTS} attempts)") from None
            log.warning("%s: %s; fetching the range again (attempt %d of %d)", where, exc, attempt + 1, _ATTEMPTS)


def _get_range(
    obj: RangedObject,
    fd: int,
    part: Range,
    where: str,
    cancelled: threading.Event,
    stop: threading.Event,
    on_bytes: Callable[[int], None],
) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    start, end = part

    def check() -> None:
        if cancelled.is_set():
            raise FetchCancelled()
        if stop.is_set():
            raise _Stopped()

    check()
    try:
        response = obj.client.get_object(Bucket=obj.bucket, Key=obj.key, Range=f"bytes={start}-{end - 1}")
    except (BotoCoreError, ClientError) as exc:
        raise FetchError(f"{where}: {exc}") from None
    body = response["Body"]
    try:
        # A store that ignores Range answers 200 with the whole object, and a changed object has another size.
        answered = response.get("ContentRange")
        if answered != f"bytes {start}-{end - 1}/{obj.size}":
            raise FetchError(f"{where}: the store answered {answered or 'the whole object'}")
        offset = start
        try:
            for chunk in body.iter_chunks(_CHUNK):
                check()
                if offset + len(chunk) > end:
                    raise FetchError(f"{where}: the store sent more bytes than the range")
                _pwrite_all(fd, chunk, offset)
                offset += len(chunk)
                on_bytes(len(chunk))
        except BotoCoreError as exc:  # a read timeout, a reset connection, a short body
            raise _BodyBroken(str(exc)) from None
        if offset != end:
            raise _BodyBroken(f"the body ended at byte {offset}")
    finally:
        body.close()


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _resume(obj: RangedObject, partial: Path) -> list[Range]:
    """The ranges of ``partial`` already fetched, with a sidecar in place that lists exactly those."""
    sidecar = sidecar_path(partial)
    header = {"size": obj.size, "sha256": obj.sha256}
    length = partial.stat().st_size if partial.exists() else 0
    recorded = _read_sidecar(sidecar, header) if sidecar.exists() else None
    rewrite = recorded is None
    if recorded is None:
        if not sidecar.exists() and length <= obj.size:
            recorded = [(0, length)] if length else []  # a sequential download's prefix
        else:  # a sidecar for another entry (its partial has holes), or longer than the file: start over
            partial.unlink(missing_ok=True)
            recorded, length = [], 0
    # Only bytes inside the file count: it is missing or short if the agent stopped before preallocating it.
    done = [(s, min(e, length)) for s, e in recorded if s < length]
    if rewrite or done != recorded:
        lines = [json.dumps(header), *(f"{s}-{e}" for s, e in done)]
        staging = sidecar.with_name(sidecar.name + ".tmp")
        staging.write_text("\n".join(lines) + "\n")
        os.replace(staging, sidecar)
    return done


def _read_sidecar(sidecar: Path, header: dict[str, Any]) -> list[Range] | None:
    """The completed ranges, or None when the sidecar is unreadable or for another entry."""
    try:
        first, *rest = sidecar.read_text().splitlines()
        if json.loads(first) != header:
            return None
    except (OSError, ValueError):
        return None
    done: list[Range] = []
    for line in rest:
        start, _, end = line.partition("-")
        if start.isdigit() and end.isdigit() and int(start) < int(end) <= header["size"]:
            done.append((int(start), int(end)))  # a torn last line (the agent killed mid-write) is skipped
    return done
