"""server/run/read_ahead.py: bytes made ahead of a slow reader, bounded, in order, cancellable."""

from __future__ import annotations

import asyncio

import pytest

from higgs_serve.server.run.read_ahead import read_ahead


def _source(pulled: list[int], closed: list[bool], count: int = 10, size: int = 1024):
    async def items():
        try:
            for i in range(count):
                pulled.append(i)
                yield bytes([i]) * size
        finally:
            closed.append(True)
    return items()


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_the_pull_stops_at_the_bound_until_the_reader_takes_bytes():
    async def main():
        pulled, closed, done = [], [], []
        reader = read_ahead(_source(pulled, closed), when_done=lambda: done.append(True), max_bytes=2048)
        first = await reader.__anext__()
        await _settle()
        assert first == bytes([0]) * 1024
        assert len(pulled) <= 4 and not done  # about max_bytes queued, the rest not yet made
        rest = [item async for item in reader]
        assert [item[0] for item in rest] == list(range(1, 10)) and done == [True] and closed == [True]
    asyncio.run(main())


def test_a_reply_under_the_bound_is_made_whole_before_it_is_read():
    async def main():
        pulled, closed, done = [], [], []
        reader = read_ahead(_source(pulled, closed), when_done=lambda: done.append(True))
        await reader.__anext__()
        await _settle()
        assert len(pulled) == 10 and done == [True]  # the slot is freed though 9 items are unread
        await reader.aclose()
    asyncio.run(main())


def test_closing_early_cancels_the_pull_and_runs_the_sources_cleanup():
    async def main():
        pulled, closed = [], []
        reader = read_ahead(_source(pulled, closed, count=100), max_bytes=1024)
        await reader.__anext__()
        await reader.aclose()
        assert closed == [True] and len(pulled) < 100
    asyncio.run(main())


def test_an_error_of_the_source_comes_in_its_place():
    async def failing():
        yield b"a"
        raise ValueError("broken")

    async def main():
        got = []
        with pytest.raises(ValueError, match="broken"):
            async for item in read_ahead(failing()):
                got.append(item)
        assert got == [b"a"]
    asyncio.run(main())
