"""A container restored from a checkpoint archive (ckptarchive.py's layout): CreateContainer
whose image is the archive's path, as CRI-O takes it.

The archive is untrusted input, like an image. What it decides is the processes' state
(CRIU's images), the files the container had written (`rootfs-diff.tar`) and deleted
(`deleted.files`), and the image the container was made from (`config.dump`, which must
be present on the node). Everything else comes from the restore request as for any
CreateContainer: the spec, mounts, user, security settings and resources; the archive's
`spec.dump` and `bind.mounts` are never read. Its members are taken only by known names,
as regular files and directories, within size limits; the writable-layer diff is written
into the container's rootfs with every path resolved inside it (openat2 RESOLVE_IN_ROOT),
regular files, directories, symlinks and hard links only. At StartContainer the runtime
restores the processes (`runc restore` under conmon) instead of starting the command.

Everything here blocks but `source_of` and `started`: call it through asyncio.to_thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import posixpath
import shutil
import stat
import tarfile
from dataclasses import dataclass
from typing import IO, Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container import ckptarchive as ar
from crishim.container.user import open_in_root
from crishim.errors import FailedPrecondition, InvalidArgument
from crishim.oci import annotations as cri_ann
from crishim.oci import spec as oci_spec

MAX_JSON = 4 << 20  # config.dump, deleted.files: a few KiB in a real archive
MAX_TOTAL = 64 << 30  # all the archive's members together (CRIU's images hold the memory)
MAX_MEMBERS = 200_000
_CHUNK = 1 << 20
_O_PATH = getattr(os, "O_PATH", 0o10000000)
CRIU_CONF = "criu.conf"  # in the bundle: CRIU's options for this container


@dataclass(frozen=True)
class Source:
    archive: str
    image: str  # the image the checkpointed container was made from


def is_archive_path(image: str) -> bool:
    """An image "name" that is a path: a checkpoint archive (no image name starts so)."""
    return image.startswith("/")


def _bad(archive: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"checkpoint archive {archive}: {why}")


def _open(archive: str) -> tarfile.TarFile:
    try:
        st = os.stat(archive)
    except OSError as exc:
        raise FailedPrecondition(f"checkpoint archive {archive}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _bad(archive, "not a regular file")
    try:
        return tarfile.open(archive, mode="r:")
    except (tarfile.TarError, OSError) as exc:
        raise _bad(archive, f"not a tar archive ({exc})") from None


def _read_json(tar: tarfile.TarFile, m: tarfile.TarInfo, archive: str) -> Any:
    if not m.isreg() or m.size > MAX_JSON:
        raise _bad(archive, f"{m.name} is not a JSON file of at most {MAX_JSON} bytes")
    f = tar.extractfile(m)
    assert f is not None
    try:
        return json.loads(f.read(MAX_JSON))
    except ValueError as exc:
        raise _bad(archive, f"{m.name} is not JSON: {exc}") from None


def _identity(archive: str) -> Source:
    with _open(archive) as tar:
        for m in tar:
            if m.name.lstrip("./") == ar.CONFIG_DUMP:
                config = _read_json(tar, m, archive)
                break
        else:
            raise _bad(archive, f"no {ar.CONFIG_DUMP}: not a container checkpoint")
    image = ""
    if isinstance(config, dict):
        image = config.get("rootfsImageRef") or config.get("rootfsImageName") or ""
    if not isinstance(image, str) or not image or is_archive_path(image):
        raise _bad(archive, f"{ar.CONFIG_DUMP} names no image (rootfsImageRef)")
    return Source(archive, image)


async def source_of(config: pb.ContainerConfig) -> tuple[Source | None,
                                                         pb.ContainerConfig]:
    """(the archive, the config with the archive's base image) when the config's image
    is a checkpoint archive; (None, the config) for any other."""
    if not is_archive_path(config.image.image):
        return None, config
    source = await asyncio.to_thread(_identity, config.image.image)
    out = pb.ContainerConfig()
    out.CopyFrom(config)
    out.image.image = source.image
    return source, out


async def started(images: str) -> str:
    """After a restore: CRIU's images (every memory page) are not kept; returns "" (the
    record's restore_from)."""
    if images:
        await asyncio.to_thread(shutil.rmtree, os.path.dirname(images), True)
    return ""


def _member_path(name: str) -> str:
    """A member's path, normalized; "" for one that climbs out or is absolute."""
    if name.startswith("/"):
        return ""
    norm = posixpath.normpath(name)
    return "" if norm in (".", "..") or norm.startswith("../") else norm


def _copy(src: IO[bytes], fd: int, size: int) -> None:
    left = size
    while left > 0:
        chunk = src.read(min(_CHUNK, left))
        if not chunk:
            break
        os.write(fd, chunk)
        left -= len(chunk)


def unpack(archive: str, dest: str) -> list[str]:
    """CRIU's images into `dest`/checkpoint, rootfs-diff.tar into `dest`; returns the
    deleted files. Only the members restore needs, as regular files (the images flat in
    one directory), within MAX_TOTAL and MAX_MEMBERS; `dest` is new and ours, so nothing
    in it is a link to follow."""
    images = os.path.join(dest, ar.CHECKPOINT_DIR)
    os.makedirs(images, mode=0o700)
    deleted: list[str] = []
    total = count = 0
    with _open(archive) as tar:
        for m in tar:
            count += 1
            if count > MAX_MEMBERS:
                raise _bad(archive, f"more than {MAX_MEMBERS} members")
            path = _member_path(m.name)
            if path == ar.DELETED_FILES:
                value = _read_json(tar, m, archive)
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise _bad(archive, f"{ar.DELETED_FILES} is not a list of paths")
                deleted = value
                continue
            top, _, rest = path.partition("/")
            if not (path == ar.ROOTFS_DIFF or (top == ar.CHECKPOINT_DIR and rest
                                                and "/" not in rest)):
                continue  # the metadata and logs restore does not read
            if not m.isreg():
                raise _bad(archive, f"{m.name} is not a regular file")
            total += m.size
            if total > MAX_TOTAL:
                raise _bad(archive, f"members larger than {MAX_TOTAL} bytes")
            src = tar.extractfile(m)
            assert src is not None
            fd = os.open(os.path.join(dest, path), os.O_WRONLY | os.O_CREAT | os.O_EXCL
                         | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                _copy(src, fd, m.size)
            finally:
                os.close(fd)
    if not os.listdir(images):
        raise _bad(archive, "no CRIU images (checkpoint/)")
    return deleted


class _Root:
    """Writes below a rootfs, every path resolved inside it."""

    def __init__(self, root: str) -> None:
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        os.close(self.fd)

    def parent(self, path: str) -> tuple[int, str]:
        """(an O_PATH fd of `path`'s directory, its last name)."""
        head, base = posixpath.split(path)
        return open_in_root(self.fd, head or ".", _O_PATH | os.O_DIRECTORY), base

    @staticmethod
    def clear(dfd: int, base: str, keep_dir: bool) -> None:
        try:
            st = os.stat(base, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return
            shutil.rmtree(base, dir_fd=dfd)
        else:
            os.unlink(base, dir_fd=dfd)


def _apply_member(root: _Root, tar: tarfile.TarFile, m: tarfile.TarInfo, path: str) -> None:
    dfd, base = root.parent(path)
    try:
        root.clear(dfd, base, keep_dir=m.isdir())
        if m.isdir():
            with contextlib.suppress(FileExistsError):  # a dir kept by clear()
                os.mkdir(base, 0o700, dir_fd=dfd)
        elif m.issym():
            os.symlink(m.linkname, base, dir_fd=dfd)
        elif m.islnk():
            target = _member_path(m.linkname)
            if not target:
                return
            tfd = open_in_root(root.fd, target, _O_PATH | os.O_NOFOLLOW)
            try:
                if not stat.S_ISREG(os.fstat(tfd).st_mode):
                    return
                os.link(f"/proc/self/fd/{tfd}", base, dst_dir_fd=dfd, follow_symlinks=True)
            finally:
                os.close(tfd)
            return
        else:  # a regular file (the caller passes nothing else)
            src = tar.extractfile(m)
            assert src is not None
            fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                _copy(src, fd, m.size)
            finally:
                os.close(fd)
        os.chown(base, m.uid, m.gid, dir_fd=dfd, follow_symlinks=False)
        if not m.issym():
            os.chmod(base, m.mode & 0o7777, dir_fd=dfd)
    finally:
        os.close(dfd)


def apply_rootfs(rootfs: str, diff_tar: str, deleted: list[str]) -> None:
    """The checkpointed container's files written into the new container's rootfs, then
    the files it had deleted removed. Members of other types (devices, FIFOs) and paths
    that climb out are skipped."""
    root = _Root(rootfs)
    try:
        with tarfile.open(diff_tar, mode="r:") as tar:
            for m in tar:
                path = _member_path(m.name)
                if path and (m.isreg() or m.isdir() or m.issym() or m.islnk()):
                    _apply_member(root, tar, m, path)
        for name in deleted:
            path = _member_path(name.lstrip("/"))
            if not path:
                continue
            try:
                dfd, base = root.parent(path)
            except OSError:
                continue  # its directory is gone too
            try:
                root.clear(dfd, base, keep_dir=False)
            finally:
                os.close(dfd)
    except (tarfile.TarError, OSError) as exc:
        raise InvalidArgument(f"checkpoint archive's {ar.ROOTFS_DIFF} cannot be applied: "
                              f"{exc}") from None
    finally:
        root.close()


def _criu_config(bundle: str) -> None:
    """CRIU puts restored processes back into the cgroups its images name: the
    checkpointed container's (runc 1.1 maps them to the new container's on cgroup v1
    only), where neither a kill of the new container nor its limits reach them, and
    conmon waits for an exit that never comes. `manage-cgroups ignore` leaves them where
    runc put CRIU: the new container's cgroup. runc hands CRIU the file the spec's
    annotation names (a request can never set that annotation: oci/annotations.py)."""
    path = os.path.join(bundle, CRIU_CONF)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("manage-cgroups=ignore\n")
    spec = oci_spec.read_bundle(bundle)
    spec.setdefault("annotations", {})[cri_ann.CRIU_CONFIG] = path
    oci_spec.write_bundle(bundle, spec)


def prepare(rootfs: str, bundle: str, archive: str) -> str:
    """Unpack the archive beside the bundle and apply its files to the rootfs; returns
    the directory of CRIU's images for the runtime's restore."""
    _criu_config(bundle)
    dest = os.path.join(bundle, "restore")
    deleted = unpack(archive, dest)
    diff = os.path.join(dest, ar.ROOTFS_DIFF)
    if os.path.exists(diff):
        apply_rootfs(rootfs, diff, deleted)
        os.unlink(diff)
    return os.path.join(dest, ar.CHECKPOINT_DIR)
