"""The files of a container checkpoint and the archive that holds them: the layout the
kubelet's checkpoint API and checkpointctl read, as CRI-O and containerd write it (an
uncompressed tar, readable by root alone: it holds every memory page of the container).

    checkpoint/       CRIU's images (`runc checkpoint --image-path`)
    dump.log          CRIU's log of the dump
    stats-dump        CRIU's statistics of the dump
    config.dump       JSON: the container's id, name, image and runtime, when it was made
                      and when it was checkpointed
    spec.dump         the container's OCI spec, as the runtime ran it
    bind.mounts       JSON: each bind mount's source, destination and file type
    rootfs-diff.tar   what the container wrote in its root filesystem: the overlay's upper
                      dir without whiteouts and without the mount points the runtime made
    deleted.files     JSON: the image's files the container deleted (only when there are)
    container.log     the container's log so far (only when the kubelet gave it one)

Everything here blocks: call it through asyncio.to_thread.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import stat
import tarfile
from typing import Any

from crishim.errors import AlreadyExists, FailedPrecondition
from crishim.store.container import Container

CHECKPOINT_DIR = "checkpoint"
DUMP_LOG = "dump.log"
STATS_DUMP = "stats-dump"
CONFIG_DUMP = "config.dump"
SPEC_DUMP = "spec.dump"
BIND_MOUNTS = "bind.mounts"
ROOTFS_DIFF = "rootfs-diff.tar"
DELETED_FILES = "deleted.files"
CONTAINER_LOG = "container.log"
# In this order in the archive (the small metadata first, for readers that stop early).
MEMBERS = (CONFIG_DUMP, SPEC_DUMP, BIND_MOUNTS, DELETED_FILES, DUMP_LOG, STATS_DUMP,
           CONTAINER_LOG, ROOTFS_DIFF, CHECKPOINT_DIR)

# Kernel and runtime mounts: never part of what the container wrote.
_RUNTIME_MOUNTS = frozenset({"/dev", "/dev/shm", "/proc", "/run", "/sys"})


def rfc3339(ns: int) -> str:
    t = datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def config_dump(rec: Container, runtime: str, now_ns: int) -> dict[str, Any]:
    """The container's identity as checkpointctl reads it (its ContainerConfig)."""
    return {"id": rec.id, "name": rec.name,
            "rootfsImage": rec.config.image.user_specified_image or rec.config.image.image,
            "rootfsImageRef": rec.image_id, "rootfsImageName": rec.image_name,
            "runtime": runtime, "createdTime": rfc3339(rec.created_at),
            "checkpointedTime": rfc3339(now_ns)}


def bind_mounts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec's bind mounts with their sources' types: a restore must find (or make) a
    source of the same type, or CRIU cannot mount it back."""
    out = []
    for m in spec.get("mounts") or []:
        opts = m.get("options") or []
        if m.get("destination") in _RUNTIME_MOUNTS or not (m.get("type") == "bind"
                                                          or "bind" in opts or "rbind" in opts):
            continue
        try:
            st = os.stat(m["source"])
        except OSError:
            continue
        out.append({"source": m["source"], "destination": m["destination"],
                    "file_type": "directory" if stat.S_ISDIR(st.st_mode) else "file",
                    "permissions": stat.S_IMODE(st.st_mode)})
    return out


def write_json(path: str, value: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f, indent=2)


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def rootfs_diff(upper: str, dest: str, spec: dict[str, Any]) -> list[str]:
    """Tar the container's writable layer into `dest`; returns the deleted paths (the
    overlay's whiteouts), which the tar leaves out. The mount points the runtime made in
    the upper dir (empty, under a mount while the container runs) are left out too."""
    mounts = {m.get("destination", "") for m in spec.get("mounts") or []} | _RUNTIME_MOUNTS
    deleted: list[str] = []
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w",
                                                format=tarfile.PAX_FORMAT) as tar:
        for top, dirs, files in os.walk(upper):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(top, name)
                rel = os.path.relpath(path, upper)
                st = os.lstat(path)
                if _is_whiteout(st):
                    deleted.append("/" + rel)
                    continue
                if "/" + rel in mounts:
                    continue
                tar.add(path, arcname=rel, recursive=False)
    return deleted


def check_location(location: str) -> None:
    """Before the dump: the archive could be made at `location` (open_exclusive decides)."""
    parent = os.path.dirname(location) or "/"
    if not os.path.isdir(parent):
        raise FailedPrecondition(f"location {location}: directory {parent} does not exist")
    if os.path.lexists(location):
        raise AlreadyExists(f"location {location} already exists; a checkpoint never "
                            "overwrites a file")


def open_exclusive(location: str) -> int:
    """The archive's file, made here: never an existing file, never through a symlink."""
    check_location(location)
    try:
        return os.open(location, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                       | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise AlreadyExists(f"location {location} already exists; a checkpoint never "
                            "overwrites a file") from None


def write_archive(location: str, work: str) -> None:
    """The archive of what `work` holds (MEMBERS, those present) at `location`; a partial
    archive is removed when writing it fails."""
    fd = open_exclusive(location)
    made = os.fstat(fd)
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w",
                                                    format=tarfile.PAX_FORMAT) as tar:
            for name in MEMBERS:
                path = os.path.join(work, name)
                if os.path.lexists(path):
                    tar.add(path, arcname=name)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        remove_if_ours(location, made)
        raise


def remove_if_ours(location: str, made: os.stat_result) -> None:
    """Unlink `location` if it is still the file this call made (not one put there since)."""
    with contextlib.suppress(OSError):
        st = os.lstat(location)
        if (st.st_dev, st.st_ino) == (made.st_dev, made.st_ino):
            os.unlink(location)
