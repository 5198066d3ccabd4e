"""Wait, on the event loop, until a file descriptor becomes readable (no thread, no poll)."""

from __future__ import annotations

import asyncio


async def wait_readable(fd: int, timeout: float) -> bool:  # noqa: ASYNC109 - a plain bound
    """True once `fd` is readable, False after `timeout` seconds. The caller owns `fd`."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await asyncio.wait_for(ready, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
