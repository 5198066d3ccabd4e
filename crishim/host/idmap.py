"""User namespaces with a given id mapping, and idmapped mounts made with them.

A user namespace can only be entered or created by a single-threaded process, and the
daemon has threads, so a short-lived helper (`unshare --user [--net] sh`) creates it;
the daemon, root in the parent namespace, writes its uid_map/gid_map, then pins its
namespaces with bind mounts (as network namespaces are pinned) or opens the user
namespace for mount_setattr(MOUNT_ATTR_IDMAP), and lets the helper exit. A network
namespace made by the same helper is owned by the new user namespace, which is what lets
the container's runtime mount sysfs and set net.* sysctls from inside it.

The mount steps block: the async functions here run them through asyncio.to_thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import AsyncIterator, Sequence

from crishim.host import libc, remove
from crishim.host.mount import MOUNTINFO, detach, make_target

# (container_id, host_id, length), as CRI's IDMapping and OCI's LinuxIDMapping.
Mapping = tuple[int, int, int]

UNSHARE = "unshare"
SHELL = "/bin/sh"
_HELPER_TIMEOUT = 10.0


class IdmapError(OSError):
    """A user namespace or idmapped mount could not be made (errno and what failed)."""


def map_text(mappings: Sequence[Mapping]) -> str:
    """uid_map/gid_map content: one "<inside> <outside> <length>" line per mapping."""
    return "".join(f"{c} {h} {n}\n" for c, h, n in mappings)


def _write_map(pid: int, name: str, mappings: Sequence[Mapping]) -> None:
    # The kernel takes a map in one write(2) only.
    fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, map_text(mappings).encode())
    finally:
        os.close(fd)


@contextlib.asynccontextmanager
async def helper(uids: Sequence[Mapping], gids: Sequence[Mapping],
                 net: bool = False) -> AsyncIterator[int]:
    """A process in a new user namespace (and a new network namespace owned by it, with
    `net`) whose maps are written; yields its pid. It exits when the block ends."""
    args = [UNSHARE, "--user", *(["--net"] if net else []), "--", SHELL, "-c",
            "echo ready; read _"]
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        raise IdmapError(exc.errno or errno.ENOENT,
                         f"cannot start {UNSHARE} for a user namespace: {exc}") from None
    try:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), _HELPER_TIMEOUT)
        except TimeoutError:
            line = b""
        if line.strip() != b"ready":
            err = b""
            if proc.stderr is not None:
                with contextlib.suppress(TimeoutError):
                    err = await asyncio.wait_for(proc.stderr.read(), 1.0)
            raise IdmapError(errno.EPERM, "cannot create a user namespace: "
                             + (err.decode(errors="replace").strip() or "helper did not start"))
        try:
            await asyncio.to_thread(_write_map, proc.pid, "uid_map", uids)
            await asyncio.to_thread(_write_map, proc.pid, "gid_map", gids)
        except OSError as exc:
            raise IdmapError(exc.errno or errno.EINVAL,
                             f"the kernel refused the id mapping {list(uids)} / {list(gids)}: "
                             f"{os.strerror(exc.errno or 0)}") from None
        yield proc.pid
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                if proc.stdin is not None:
                    proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), _HELPER_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()


def _pin(pid: int, kind: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
    os.close(fd)
    libc.mount(f"/proc/{pid}/ns/{kind}", path, None, libc.MS_BIND,
               what=f"pin {kind} namespace at {path}")


async def create_pinned(uids: Sequence[Mapping], gids: Sequence[Mapping], userns_path: str,
                        netns_path: str = "", *, roots: Sequence[str]) -> None:
    """A user namespace with these maps pinned at `userns_path` and, with `netns_path`, a
    network namespace owned by it pinned there. Pins already in place are kept (a retried
    RunPodSandbox) only when both are. `roots`: where stale pins may be removed."""
    if is_pinned(userns_path) and (not netns_path or is_pinned(netns_path)):
        return
    await asyncio.to_thread(remove_pins, userns_path, netns_path, roots=roots)
    async with helper(uids, gids, net=bool(netns_path)) as pid:
        try:
            await asyncio.to_thread(_pin, pid, "user", userns_path)
            if netns_path:
                await asyncio.to_thread(_pin, pid, "net", netns_path)
        except BaseException:
            await asyncio.to_thread(remove_pins, userns_path, netns_path, roots=roots)
            raise


def is_pinned(path: str) -> bool:
    """True when a namespace file (nsfs) is bind-mounted at `path`."""
    with contextlib.suppress(OSError), open(MOUNTINFO) as fh:
        for line in fh:
            fields, _, fs = line.partition(" - ")
            if fields.split()[4] == path and fs.split()[0] == "nsfs":
                return True
    return False


def remove_pins(*paths: str, roots: Sequence[str]) -> None:
    """Unpin (lazy unmount, repeated for stacked pins) and delete; idempotent. A path
    outside `roots` (the daemon's) is neither unmounted nor deleted (OutsideRoots)."""
    for path in paths:
        if not path:
            continue
        path = remove.confined(path, roots)
        detach(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _bind_idmapped(source: str, target: str, userns_fd: int, readonly: bool) -> None:
    fd = libc.open_tree(source, libc.OPEN_TREE_CLONE | libc.AT_RECURSIVE)
    try:
        libc.mount_setattr_idmap(fd, userns_fd, what=f"idmap {source}", readonly=readonly)
        libc.move_mount(fd, target)
    finally:
        os.close(fd)


def bind_idmapped_sync(sources: Sequence[tuple[str, str]], userns_path: str, *,
                       readonly: bool) -> None:
    """Idmapped bind mounts (recursive) of each (source, target) with the maps of the
    user namespace pinned at `userns_path`. Blocking.

    `readonly` is set on the detached tree, in the host's mount namespace, before it is
    attached: a mount namespace a pod's runtime later creates in the pod's user namespace
    copies it with the flag locked (MNT_LOCK_READONLY), so that nothing in the pod, even
    with CAP_SYS_ADMIN in its user namespace, can remount it read-write. A read-only
    flag added inside the pod's own mount namespace is not locked: the pod may undo it."""
    uns = os.open(userns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for source, target in sources:
            make_target(source, target)
            _bind_idmapped(source, target, uns, readonly)
    finally:
        os.close(uns)


async def bind_idmapped(sources: Sequence[tuple[str, str]], uids: Sequence[Mapping],
                        gids: Sequence[Mapping], *, readonly: bool) -> None:
    """Idmapped bind mounts with maps of their own (a helper's user namespace)."""
    async with helper(uids, gids) as pid:
        await asyncio.to_thread(bind_idmapped_sync, sources, f"/proc/{pid}/ns/user",
                                readonly=readonly)


def _probe_sync(path: str, userns_path: str) -> None:
    uns = os.open(userns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fd = libc.open_tree(path, libc.OPEN_TREE_CLONE)
        try:
            libc.mount_setattr_idmap(fd, uns, what=f"idmap {path}")
        finally:
            os.close(fd)  # never attached: closing the fd drops the copy
    finally:
        os.close(uns)


async def supports_idmap(path: str) -> str:
    """"" when the filesystem of `path` takes idmapped mounts, else why not."""
    probe = [(0, 65536, 65536)]
    try:
        async with helper(probe, probe) as pid:
            await asyncio.to_thread(_probe_sync, path, f"/proc/{pid}/ns/user")
    except OSError as exc:
        return str(exc)
    return ""
