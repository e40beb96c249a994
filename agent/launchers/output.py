"""Output: an engine's stdout and stderr, appended to its log file and handed over line by line as they arrive.

The engine writes into a pipe; one task of the agent reads it in chunks, appends each chunk to the log file at once
(the file reads as if the engine wrote it itself) and passes every complete line to ``on_line``, so the agent learns
what the engine says while it says it (`agent.engine_log`) without reading the file again. A line longer than
``MAX_LINE`` bytes is handed over in pieces of that size; bytes that are not UTF-8 become U+FFFD in the line, never
in the file. The task ends at end of file: when the engine and every process that shares its output have exited.

The pipe has a cost the file did not: an agent that stops reading stalls an engine whose pipe buffer is full.
Reading is all this task does, so it keeps up; ``on_line`` must be cheap and must not block.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["MAX_LINE", "EngineOutput"]

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
_CHUNK = 64 * 1024


class EngineOutput:
    """Copies ``stream`` into ``sink`` (a file opened for appending, closed at the end) and calls ``on_line``."""

    def __init__(self, stream: asyncio.StreamReader, sink: BinaryIO, on_line: Callable[[str], None]) -> None:
        self._stream = stream
        self._sink = sink
        self._on_line = on_line
        self._partial = b""

    def start(self) -> asyncio.Task[None]:
        return asyncio.ensure_future(self.run())

    async def run(self) -> None:
        """Copy until end of file, then hand over a last unterminated line and close the file."""
        try:
            while chunk := await self._stream.read(_CHUNK):
                self._sink.write(chunk)
                self._sink.flush()
                self._split(chunk)
            if self._partial:
                self._emit(self._partial)
        finally:
            self._sink.close()

    def _split(self, chunk: bytes) -> None:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            self._emit(line)
        while len(self._partial) > MAX_LINE:
            self._emit(self._partial[:MAX_LINE])
            self._partial = self._partial[MAX_LINE:]

    def _emit(self, line: bytes) -> None:
        try:
            self._on_line(line.rstrip(b"\r").decode("utf-8", errors="replace"))
        except Exception:
            # A failing reader must not stop the copy: the engine would block on its full pipe and the log end.
            log.exception("engine output: the line reader failed; the log continues")
