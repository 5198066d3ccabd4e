"""An image's layers mounted as a root filesystem: an overlay of the layers + a private
upper dir, for a container and for a pause image alike (as containerd's snapshotter sits
below its CRI plugin).

mount(2) takes the overlay options as one string of at most a page (4096 bytes). With
many layers the absolute lowerdir list does not fit; then the bundle gets a dir of short
symlinks to the layers ("l/0", "l/1", ...), the lowerdirs are given relative to it, and
`mount` runs with that dir as its cwd (the kernel resolves relative lowerdirs against the
caller's cwd), like containerd's short snapshot ids. That needs a child process: chdir in
the daemon would change every thread's cwd.

All functions block: call them through asyncio.to_thread (or await the async ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
from dataclasses import dataclass

from crishim.errors import FailedPrecondition, Internal
from crishim.host import idmap, libc, modes, remove
from crishim.host.mount import detach, is_mountpoint, mounted_under
from crishim.log import get_logger

log = get_logger(__name__)

PAGE = resource.getpagesize()


def overlay_options(layer_dirs: list[str], upper: str, work: str,
                    relative_to: str = "") -> str:
    """Options for the overlay; `layer_dirs` is LOWEST first, overlay wants top first."""
    lowers = list(reversed(layer_dirs))
    if relative_to:
        lowers = [os.path.relpath(d, relative_to) for d in lowers]
    return f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}"


def _mount_syscall(target: str, options: str) -> None:
    try:
        libc.mount("overlay", target, "overlay", 0, options)
    except OSError as exc:
        raise Internal(f"overlay mount on {target} failed: {os.strerror(exc.errno or 0)} "
                       f"(options {options[:200]}...)") from None


def upper_dir(bundle: str) -> str:
    """The container's writable layer (the overlay's upper dir)."""
    return os.path.join(bundle, "upper")


@dataclass(frozen=True)
class IdmappedLayers:
    """A rootfs for a pod in its own user namespace: the layers are seen through idmapped
    mounts with the pod's maps (a file of uid 0 in a layer is the pod's root), and the
    upper dir belongs to the pod's root, so what the container writes is owned by its
    host uid. overlayfs cannot itself be idmapped, but takes idmapped layers (Linux
    >= 5.19)."""

    userns_path: str  # the pod's pinned user namespace
    owner: tuple[int, int]  # host uid/gid of the pod's root


async def mount_rootfs(layer_dirs: list[str], bundle: str,
                       idmapped: IdmappedLayers | None = None) -> str:
    """Create <bundle> (if need be) and <bundle>/{upper,work,rootfs}, and mount the overlay
    on rootfs; return it. The directories and the mount are one thread hop where the
    options fit one mount call: a mkdir in a large directory on disk can wait for I/O."""
    upper = upper_dir(bundle)
    work, target, empty = (os.path.join(bundle, n) for n in ("work", "rootfs", "empty"))
    dirs = [upper, work, target]
    if not layer_dirs:
        # An image without layers: an empty, read-only lower dir.
        dirs.append(empty)
        layer_dirs = [empty]
    if idmapped is None:
        options = overlay_options(layer_dirs, upper, work)
        if len(options) < PAGE:
            await asyncio.to_thread(_make_and_mount, bundle, dirs, target, options)
            return target
    group = idmapped.owner[1] if idmapped is not None else None
    await asyncio.to_thread(_make_bundle_dirs, bundle, dirs, group)
    if idmapped is None:
        await _mount_overlay(layer_dirs, upper, work, target, os.path.join(bundle, "l"))
        return target
    await asyncio.to_thread(os.chown, upper, *idmapped.owner)
    # "<bundle>/m/<n>": short mount points of the idmapped layers, used only while the
    # overlay is mounted (it keeps private clones of its layers), then detached.
    mapped = os.path.join(bundle, "m")
    lowers = [os.path.join(mapped, str(i)) for i in range(len(layer_dirs))]
    try:
        # Read-only: overlayfs never writes a lower layer, and the layers are shared.
        await asyncio.to_thread(idmap.bind_idmapped_sync, list(zip(layer_dirs, lowers,
                                                                   strict=True)),
                                idmapped.userns_path, readonly=True)
        await _mount_overlay(lowers, upper, work, target, mapped)
    finally:
        await asyncio.to_thread(_detach_all, lowers, bundle)
    return target


def _make_bundle_dirs(bundle: str, dirs: list[str], group: int | None = None) -> None:
    """The bundle: private, 0710 with the pod's root group in a user namespace, whose init
    resolves the rootfs path through it (host/modes.py)."""
    modes.make_dir(bundle, modes.bundle_mode(group), group)
    _make_dirs(*dirs)


def _make_and_mount(bundle: str, dirs: list[str], target: str, options: str) -> None:
    _make_bundle_dirs(bundle, dirs)
    _mount_syscall(target, options)


async def _mount_overlay(layer_dirs: list[str], upper: str, work: str, target: str,
                         links: str) -> None:
    options = overlay_options(layer_dirs, upper, work)
    if len(options) < PAGE:
        await asyncio.to_thread(_mount_syscall, target, options)
        return
    # Too long: lowerdirs relative to `links`, where short names ("<n>") lead to the
    # layers (symlinks, which overlayfs follows; or the layers' own short mount points).
    if all(os.path.dirname(d) == links for d in layer_dirs):
        short = layer_dirs
    else:
        short = await asyncio.to_thread(_short_links, layer_dirs, links)
    options = overlay_options(short, upper, work, relative_to=links)
    if len(options) >= PAGE:
        raise FailedPrecondition(
            f"image has too many layers ({len(layer_dirs)}) for one overlay mount")
    proc = await asyncio.create_subprocess_exec(
        "mount", "-t", "overlay", "overlay", "-o", options, target, cwd=links,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise Internal(f"overlay mount on {target} failed: {err.decode(errors='replace')}")


def _detach_all(paths: list[str], bundle: str) -> None:
    """Detach and remove these mount points, each only if strictly below `bundle` (a
    symlink planted on the way makes it OutsideRoots)."""
    for path in paths:
        path = remove.confined(path, (bundle,))
        detach(path)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(path)


async def mount_readonly(layer_dirs: list[str], target: str, empty: str) -> None:
    """A read-only overlay of the layers (no upper dir) on `target` (for image volumes).

    `empty` (created) goes below the layers: overlayfs without an upper dir needs at
    least two lower dirs, and an image may have one layer."""
    await asyncio.to_thread(_make_dirs, target, empty)
    lowers = [empty, *layer_dirs]
    options = "lowerdir=" + ":".join(reversed(lowers))
    if len(options) >= PAGE:
        raise FailedPrecondition(f"image has too many layers ({len(layer_dirs)}) for a "
                                 "read-only overlay mount")
    await asyncio.to_thread(_mount_syscall, target, options)


def _make_dirs(*dirs: str) -> None:
    # 0755 whatever the umask: the overlay's root dir takes the upper dir's mode (an empty
    # lower's for an image volume), and a container user need not be root. The bundle
    # keeps other host users out.
    for d in dirs:
        modes.make_dir(d, 0o755)


def _short_links(layer_dirs: list[str], links: str) -> list[str]:
    os.makedirs(links, mode=0o700, exist_ok=True)
    short = []
    for i, d in enumerate(layer_dirs):
        name = os.path.join(links, str(i))
        # Only below the bundle: `links` is <bundle>/l, never followed out of it.
        remove.unlink(name, (os.path.dirname(links),))
        os.symlink(d, name)
        short.append(name)
    return short


def unmount(target: str) -> None:
    """Unmount everything at `target` (idempotent); lazily if it is busy."""
    while is_mountpoint(target):
        try:
            libc.umount2(target)
            continue
        except OSError as busy:
            err = busy.errno or 0
        try:
            libc.umount2(target, libc.MNT_DETACH)
        except OSError as exc:
            raise Internal(f"cannot unmount {target}: {os.strerror(exc.errno or 0)}") from None
        log.warning("rootfs busy; detached lazily", path=target, error=os.strerror(err))


def unmount_all(rootfs: str, bundle: str, image_mounts: bool) -> None:
    """Unmount a dead container's rootfs (and, with `image_mounts`, every image volume
    under its bundle); idempotent. Without image volumes only the rootfs can be mounted,
    so it is unmounted straight away rather than after a scan of the mount table."""
    targets = mounted_under(bundle) if image_mounts else [rootfs]
    for target in targets:
        try:
            libc.umount2(target)
            continue
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT):
                continue  # not (or no longer) a mount point
        unmount(target)  # busy: falls back to a lazy detach

