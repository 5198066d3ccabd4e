"""A burst of terminal resizes reaches conmon as a few writes, one at a time, the last size
last (crishim/streaming/resizes.py)."""

from __future__ import annotations

import asyncio

from crishim.streaming.interface import TerminalSize
from crishim.streaming.resizes import TerminalResizes


async def test_a_burst_is_written_in_turn_and_ends_on_the_latest_size() -> None:
    written: list[tuple[str, int, int]] = []
    in_flight = 0
    most = 0

    async def write(bundle: str, height: int, width: int) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0)
        written.append((bundle, height, width))
        in_flight -= 1

    resizes = TerminalResizes(write, gap=0)
    for i in range(100):
        resizes.resize("/b1", TerminalSize(width=80 + i, height=24))
        resizes.resize("/b2", TerminalSize(width=40, height=10 + i))
    await resizes.wait_idle()
    b1 = [w for w in written if w[0] == "/b1"]
    b2 = [w for w in written if w[0] == "/b2"]
    # Sizes asked for before the writer ran are replaced by the latest: one write each.
    assert b1 == [("/b1", 24, 179)]
    assert b2 == [("/b2", 109, 40)]
    assert most <= 2  # one writer per container


async def test_sizes_asked_for_while_a_write_runs_end_on_the_latest() -> None:
    written: list[int] = []
    release = asyncio.Event()
    first = asyncio.Event()

    async def write(bundle: str, height: int, width: int) -> None:
        written.append(width)
        if len(written) == 1:
            first.set()
            await release.wait()

    resizes = TerminalResizes(write, gap=0)
    resizes.resize("/b", TerminalSize(width=1, height=1))
    await first.wait()
    for width in range(2, 50):
        resizes.resize("/b", TerminalSize(width=width, height=1))
    release.set()
    await resizes.wait_idle()
    assert written == [1, 49]


async def test_a_failed_write_does_not_stop_later_resizes() -> None:
    written: list[int] = []

    async def write(bundle: str, height: int, width: int) -> None:
        if width == 1:
            raise OSError("conmon is gone")
        written.append(width)

    resizes = TerminalResizes(write, gap=0)
    resizes.resize("/b", TerminalSize(width=1, height=1))
    await resizes.wait_idle()
    resizes.resize("/b", TerminalSize(width=2, height=1))
    await resizes.wait_idle()
    assert written == [2]
