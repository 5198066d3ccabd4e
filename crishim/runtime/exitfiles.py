"""Notice container exits: conmon writes `<exit_dir>/<container id>` with the exit code.

Uses inotify on the exit dir through the event loop (no polling, no thread). Exit files
that already exist when watching starts (the container died while crishim was down) are
reported too, so nothing is missed across restarts. The exit time is the file's mtime.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import os
import struct
from collections.abc import Awaitable, Callable

from crishim.host import libc
from crishim.log import get_logger
from crishim.observe import tracing

log = get_logger(__name__)

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")

ExitCallback = Callable[[str, int, int], Awaitable[None] | None]


def run_callback(call: Callable[[], Awaitable[None] | None],
                 tasks: set[asyncio.Task[None]], **fields: object) -> None:
    """Run an exit callback, sync or async; a failure is logged (with `fields`), never
    raised into the event loop's reader. An async one runs as a task kept in `tasks`."""
    try:
        res = call()
    except Exception:
        log.exception("exit callback failed", **fields)
        return
    if inspect.isawaitable(res):
        async def run(aw: Awaitable[None] = res) -> None:
            try:
                await aw
            except Exception:
                log.exception("exit callback failed", **fields)

        task = asyncio.get_running_loop().create_task(run())
        tasks.add(task)
        task.add_done_callback(tasks.discard)


def read_exit(exit_dir: str, cid: str) -> tuple[int, int] | None:
    """(exit code, finished_at in ns) from conmon's exit file, or None if not written yet."""
    path = os.path.join(exit_dir, cid)
    try:
        with open(path) as fh:
            text = fh.read().strip()
        st = os.stat(path)
    except OSError:
        return None
    if not text:
        return None  # conmon has not finished writing it (IN_CLOSE_WRITE follows)
    try:
        code = int(text)
    except ValueError:
        log.warning("unreadable exit file", path=path, content=text[:40])
        code = 255
    return code, st.st_mtime_ns


class ExitFileWatcher:
    """Reports each watched container's exit file in `exit_dir`, once, to its callback."""

    def __init__(self, exit_dir: str) -> None:
        self.exit_dir = exit_dir
        self._fd = -1
        self._callbacks: dict[str, ExitCallback] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        os.makedirs(self.exit_dir, mode=0o700, exist_ok=True)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        try:
            libc.inotify_add_watch(fd, self.exit_dir, IN_CLOSE_WRITE | IN_MOVED_TO)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        # Exits are no part of the start-up trace this is called in.
        tracing.untraced(asyncio.get_running_loop().add_reader, fd, self._on_readable)
        self._scan()

    async def stop(self) -> None:
        if self._fd >= 0:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        for task in list(self._tasks):
            task.cancel()
        self._callbacks.clear()

    def watch(self, cid: str, callback: ExitCallback) -> None:
        """Call `callback(cid, exit_code, finished_at_ns)` once when `cid` exits."""
        self._callbacks[cid] = callback
        self._check(cid)  # it may already have exited

    def unwatch(self, cid: str) -> None:
        self._callbacks.pop(cid, None)

    def read_exit(self, cid: str) -> tuple[int, int] | None:
        return read_exit(self.exit_dir, cid)

    def _scan(self) -> None:
        for cid in list(self._callbacks):
            self._check(cid)

    def _check(self, cid: str) -> None:
        if cid not in self._callbacks:
            return
        result = read_exit(self.exit_dir, cid)
        if result is None:
            return
        callback = self._callbacks.pop(cid)
        self._fire(callback, cid, *result)

    def _fire(self, callback: ExitCallback, cid: str, code: int, finished: int) -> None:
        run_callback(lambda: callback(cid, code, finished), self._tasks, id=cid)

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EINTR):
                return
            raise
        offset = 0
        overflow = False
        names: list[str] = []
        while offset + _EVENT.size <= len(data):
            _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size
            raw = data[offset:offset + length]
            offset += length
            if mask & IN_Q_OVERFLOW:
                overflow = True
            name = raw.rstrip(b"\0").decode(errors="replace")
            if name:
                names.append(name)
        if overflow:
            self._scan()  # events were lost: look at every watched id
        for name in names:
            self._check(name)
