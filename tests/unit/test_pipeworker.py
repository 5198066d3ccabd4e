"""The pipe-woken worker: calls run in order on one thread; results, errors and
cancellation reach the caller; closing runs what was handed over first."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from crishim.proc.pipeworker import PipeWorker


def test_calls_run_in_order_on_one_thread_off_the_loop() -> None:
    async def main() -> None:
        seen: list[tuple[int, str]] = []
        started: list[str] = []
        worker = PipeWorker("t", initializer=lambda: started.append(
            threading.current_thread().name))

        def job(i: int) -> int:
            seen.append((i, threading.current_thread().name))
            return i * 2

        try:
            results = await asyncio.gather(*(worker.run(job, i) for i in range(200)))
        finally:
            await worker.close()
        assert results == [i * 2 for i in range(200)]
        assert [i for i, _ in seen] == list(range(200))
        assert {name for _, name in seen} == {"t"} and started == ["t"]
        assert threading.current_thread().name != "t"

    asyncio.run(main())


def test_an_error_reaches_the_caller_and_the_worker_goes_on() -> None:
    async def main() -> None:
        worker = PipeWorker("t")

        def fail() -> None:
            raise ValueError("bad row")

        try:
            with pytest.raises(ValueError, match="bad row"):
                await worker.run(fail)
            assert await worker.run(lambda: 7) == 7
        finally:
            await worker.close()

    asyncio.run(main())


def test_a_cancelled_caller_does_not_stop_the_worker() -> None:
    async def main() -> None:
        worker = PipeWorker("t")
        release = threading.Event()
        try:
            slow = asyncio.ensure_future(worker.run(release.wait, 5))
            await asyncio.sleep(0.01)
            slow.cancel()
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await slow
            assert await worker.run(lambda: "next") == "next"
        finally:
            await worker.close()

    asyncio.run(main())


def test_close_runs_what_was_handed_over_first() -> None:
    async def main() -> None:
        worker = PipeWorker("t")
        done: list[int] = []

        def job(i: int) -> None:
            time.sleep(0.01)
            done.append(i)

        pending = [asyncio.ensure_future(worker.run(job, i)) for i in range(3)]
        await asyncio.sleep(0)  # each has handed its call over
        await worker.close()
        await asyncio.gather(*pending)
        assert done == [0, 1, 2]
        await worker.close()  # idempotent

    asyncio.run(main())
