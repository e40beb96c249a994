"""An engine's output copied into its log and handed over line by line, without a process (a fed stream reader)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.launchers.output import MAX_LINE, EngineOutput


async def _copy(tmp_path: Path, chunks: list[bytes], fail_on: str | None = None) -> tuple[list[str], bytes]:
    stream = asyncio.StreamReader()
    lines: list[str] = []

    def on_line(line: str) -> None:
        if line == fail_on:
            raise RuntimeError("reader broke")
        lines.append(line)

    log = tmp_path / "engine.log"
    task = EngineOutput(stream, log.open("ab"), on_line).start()
    for chunk in chunks:
        stream.feed_data(chunk)
        await asyncio.sleep(0)
    stream.feed_eof()
    await asyncio.wait_for(task, timeout=5)
    return lines, log.read_bytes()


async def test_lines_split_across_chunks_arrive_whole_and_the_log_keeps_every_byte(tmp_path: Path) -> None:
    chunks = [b"INFO one\r\nINFO tw", b"o\nINFO thr", b"ee \xff\nlast, unterminated"]
    lines, logged = await _copy(tmp_path, chunks)
    assert lines == ["INFO one", "INFO two", "INFO three \ufffd", "last, unterminated"]
    assert logged == b"".join(chunks)


async def test_a_line_longer_than_the_limit_arrives_in_pieces(tmp_path: Path) -> None:
    lines, _ = await _copy(tmp_path, [b"x" * (MAX_LINE + 10), b"\n"])
    assert [len(line) for line in lines] == [MAX_LINE, 10]


async def test_a_failing_reader_does_not_stop_the_copy(tmp_path: Path) -> None:
    lines, logged = await _copy(tmp_path, [b"bad\ngood\n"], fail_on="bad")
    assert lines == ["good"] and logged == b"bad\ngood\n"
