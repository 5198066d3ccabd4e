"""One thread that runs calls handed to it from the event loop, in order, woken through
a pipe.

A thread pool wakes its worker through a futex, an ordinary wake-up: the kernel may put
the worker on the other CPU (on a VM, waking an idle vCPU goes through the host) or back
on the CPU it last ran on, behind whatever runs there. A write to a pipe is a
synchronous wake-up: the kernel knows the writer is about to wait, so unless a CPU is
idle it runs the reader on the writer's CPU, as soon as the loop waits for it: on a
small VM a hop after an idle spell is about a third quicker than through a pool.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any],
             tuple[Any, ...]]


class PipeWorker:
    def __init__(self, name: str, initializer: Callable[[], None] | None = None) -> None:
        self._name = name
        self._initializer = initializer
        self._jobs: collections.deque[_Job] = collections.deque()
        self._rfd = self._wfd = -1
        self._thread: threading.Thread | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the worker thread; its result or exception."""
        if self._thread is None:
            self._start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._jobs.append((loop, fut, fn, args))
        # A full pipe (64 KiB of wake-ups not yet read) means the thread is awake anyway.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wfd, b"\0")
        return await fut

    def _start(self) -> None:
        self._rfd, self._wfd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self._wfd, False)
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Run what was handed over, then end the thread."""
        if self._thread is None:
            return
        os.close(self._wfd)  # the thread reads the end of the pipe once it has caught up
        await asyncio.to_thread(self._thread.join)
        os.close(self._rfd)
        self._thread = None

    def _main(self) -> None:
        if self._initializer is not None:
            self._initializer()
        while os.read(self._rfd, 4096):  # a job appended before its byte: drain them all
            while self._jobs:
                loop, fut, fn, args = self._jobs.popleft()
                try:
                    result = fn(*args)
                except BaseException as exc:  # the caller's to handle
                    _hand_back(loop, _set_exception, fut, exc)
                else:
                    _hand_back(loop, _set_result, fut, result)


def _hand_back(loop: asyncio.AbstractEventLoop, setter: Callable[..., None],
               fut: asyncio.Future[Any], value: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(setter, fut, value)


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():  # the caller was cancelled
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
