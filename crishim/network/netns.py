"""Network namespaces pinned by a bind mount, and running code inside one.

Namespaces are per thread in Linux, so every namespace operation runs on a fresh,
short-lived OS thread: that thread unshares or setns()es, does its work and exits. The
daemon's own threads (the event loop and the default executor's pool) never change
namespace, so a failed restore can never leave a pooled thread in a pod's netns.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from crishim.host import libc, remove

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MNT_DETACH = 2
NS_GET_NSTYPE = 0xB703  # ioctl on a namespace fd: which kind of namespace is this?
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1



class NetnsError(OSError):
    """A namespace syscall failed; carries errno and the operation."""


def _netns_error(exc: OSError) -> NetnsError:
    return NetnsError(exc.errno, exc.strerror)


def _mount(source: str | None, target: str, flags: int) -> None:
    try:
        libc.mount(source, target, None, flags)
    except OSError as exc:
        raise _netns_error(exc) from None


def _umount(target: str) -> None:
    try:
        libc.umount2(target, MNT_DETACH)
    except OSError as exc:
        raise _netns_error(exc) from None


def _on_fresh_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """Run `fn` on a new OS thread that exits afterwards; the result as a future."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def deliver(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def body() -> None:
        try:
            value = fn()
        except BaseException as exc:  # delivered to the awaiting coroutine
            loop.call_soon_threadsafe(deliver, False, exc)
        else:
            loop.call_soon_threadsafe(deliver, True, value)

    # Started from a worker: Thread.start() waits until the new thread runs, which can be
    # a while on a busy node, and the event loop must not wait with it.
    thread = threading.Thread(target=body, name="netns", daemon=True)
    starting = loop.run_in_executor(None, thread.start)

    def start_failed(started: asyncio.Future[None]) -> None:
        exc = started.exception()
        if exc is not None:
            deliver(False, exc)

    starting.add_done_callback(start_failed)
    return fut


def _set_link_up(name: str) -> None:
    # A plain ioctl keeps this free of netlink: the socket lives in the thread's netns.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("16sH14x", name.encode(), 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", name.encode(),
                                                             flags | IFF_UP))


def is_netns_pinned(path: str) -> bool:
    """True when `path` is a bind mount of a network namespace."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fcntl.ioctl(fd, NS_GET_NSTYPE) == CLONE_NEWNET
    except OSError:
        return False  # a plain file, not an nsfs inode
    finally:
        os.close(fd)


def _create_sync(path: str) -> None:
    if is_netns_pinned(path):
        return
    # No shared-propagation bind of the pin dir (as `ip netns` does): since Linux 3.18,
    # umount + unlink here also detaches copies of the pin in other mount namespaces.
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    # The mount target must exist; an empty file left by an earlier crash is reused.
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
    os.close(fd)
    # This thread exits right after, taking its namespace membership with it; the bind
    # mount is what keeps the new namespace alive.
    try:
        libc.unshare(CLONE_NEWNET, "unshare(CLONE_NEWNET)")
    except OSError as exc:
        raise _netns_error(exc) from None
    _set_link_up("lo")
    _mount(f"/proc/self/task/{threading.get_native_id()}/ns/net", path, MS_BIND)


async def create_netns(path: str, *, roots: Sequence[str]) -> None:
    """Create a new network namespace (with `lo` up) pinned at `path`. If `path` already
    pins one it is kept, so a retried RunPodSandbox reuses its namespace. A failed
    create's pin file is removed only below `roots` (the daemon's)."""
    try:
        await _on_fresh_thread(lambda: _create_sync(path))
    except BaseException:
        if not is_netns_pinned(path):
            with contextlib.suppress(OSError, remove.OutsideRoots):
                remove.unlink(path, roots)
        raise


async def bring_up_loopback(path: str) -> None:
    """Set `lo` up in the namespace pinned at `path` (one made elsewhere: a pod's user
    namespace helper makes its network namespace too)."""
    await in_netns(path, lambda: _set_link_up("lo"))


def _remove_sync(path: str, roots: Sequence[str]) -> None:
    path = remove.confined(path, roots)
    # A pin may be stacked (mounted twice after a race); unmount until none is left.
    for _ in range(8):
        if not is_netns_pinned(path):
            break
        try:
            _umount(path)
        except NetnsError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOENT):
                raise
            break
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


async def remove_netns(path: str, *, roots: Sequence[str]) -> None:
    """Unpin (lazy unmount) and delete `path`. Unknown or already removed paths are fine;
    one outside `roots` (the daemon's) is neither unmounted nor deleted (OutsideRoots)."""
    await asyncio.to_thread(_remove_sync, path, roots)


def _enter_and_run(path: str, fn: Callable[[], T]) -> T:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            libc.setns(fd, CLONE_NEWNET, f"setns {path}")
        except OSError as exc:
            raise _netns_error(exc) from None
    finally:
        os.close(fd)
    # No restore needed: this thread exits when fn returns.
    return fn()


async def in_netns(path: str, fn: Callable[[], T]) -> T:
    """Run the blocking `fn` inside the network namespace pinned at `path`.

    Sockets created inside `fn` stay in that namespace after it returns, so a caller may
    create a listening/connected socket in the pod and hand it back to the loop. Read
    per-namespace files via /proc/thread-self/net/... or netlink: /proc/self/net follows
    the main thread, and /sys/class/net follows whoever mounted /sys.
    """
    if not is_netns_pinned(path):
        raise NetnsError(errno.ENOENT, f"{path} is not a pinned network namespace")
    return await _on_fresh_thread(lambda: _enter_and_run(path, fn))
