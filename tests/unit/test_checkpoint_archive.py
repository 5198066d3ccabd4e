"""A container checkpoint's archive: its members, the writable layer's diff (whiteouts as
deleted files, mount points left out), made only where asked (never over a file, never
through a symlink), nothing left behind when a step fails, and the container thawed
however the dump ends. The runtime is a fake; the e2e test in the v2 guest runs CRIU."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from crishim.container import ckptarchive as ar
from crishim.container.checkpoint import checkpoint_container, clear_leftovers
from crishim.errors import AlreadyExists, DeadlineExceeded, FailedPrecondition
from crishim.store.container import EXITED
from tests.fakes.checkpoints import SPEC, CheckpointRuntime, container_record, upper_dir


def test_the_diff_holds_what_was_written_and_lists_what_was_deleted(tmp_path: Path) -> None:
    up = upper_dir(tmp_path)
    dest = tmp_path / "rootfs-diff.tar"
    deleted = ar.rootfs_diff(str(up), str(dest), SPEC)
    assert deleted == ["/etc/group"]
    with tarfile.open(dest) as tar:
        assert sorted(tar.getnames()) == ["etc", "work", "work/count", "work/link"]
        f = tar.extractfile("work/count")
        assert f is not None and f.read() == b"41\n"
        assert tar.getmember("work/link").issym()
    assert dest.stat().st_mode & 0o777 == 0o600


def test_bind_mounts_name_their_source_types() -> None:
    assert ar.bind_mounts(SPEC) == [
        {"source": "/etc/hosts", "destination": "/etc/hosts", "file_type": "file",
         "permissions": os.stat("/etc/hosts").st_mode & 0o7777},
        {"source": "/tmp", "destination": "/data", "file_type": "directory",
         "permissions": os.stat("/tmp").st_mode & 0o7777}]


def _work(tmp: Path) -> Path:
    work = tmp / "work"
    (work / "checkpoint").mkdir(parents=True)
    (work / "checkpoint" / "inventory.img").write_bytes(b"img")
    for name in ("config.dump", "spec.dump", "dump.log", "rootfs-diff.tar"):
        (work / name).write_text(name)
    return work


def test_the_archive_is_made_only_where_asked(tmp_path: Path) -> None:
    work = _work(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    location = out / "c.tar"
    ar.write_archive(str(location), str(work))
    with tarfile.open(location) as tar:
        assert tar.getnames() == ["config.dump", "spec.dump", "dump.log", "rootfs-diff.tar",
                                  "checkpoint", "checkpoint/inventory.img"]
    assert location.stat().st_mode & 0o777 == 0o600
    with pytest.raises(AlreadyExists):
        ar.write_archive(str(location), str(work))
    target = tmp_path / "elsewhere.tar"
    (out / "link.tar").symlink_to(target)
    with pytest.raises(AlreadyExists):
        ar.write_archive(str(out / "link.tar"), str(work))
    assert not target.exists()
    with pytest.raises(FailedPrecondition, match="does not exist"):
        ar.write_archive(str(out / "no" / "c.tar"), str(work))


def test_a_failed_write_leaves_no_archive(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    work = _work(tmp_path)
    calls = []

    def add(self: tarfile.TarFile, name: str, *a: Any, **kw: Any) -> None:
        calls.append(name)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "add", add)
    with pytest.raises(OSError, match="No space"):
        ar.write_archive(str(tmp_path / "c.tar"), str(work))
    assert calls and not (tmp_path / "c.tar").exists()


async def test_a_checkpoint_pauses_dumps_thaws_and_writes(tmp_path: Path) -> None:
    rt = CheckpointRuntime()
    rec = container_record(tmp_path)
    parts = tmp_path / "parts"
    parts.mkdir()
    location = tmp_path / "c.tar"
    await checkpoint_container(rec, rt, str(parts), str(location), 0)
    assert rt.calls == ["pause", "checkpoint", "resume"]
    assert os.listdir(parts) == []
    with tarfile.open(location) as tar:
        names = tar.getnames()
        assert {"config.dump", "spec.dump", "bind.mounts", "deleted.files", "dump.log",
                "container.log", "rootfs-diff.tar", "checkpoint/inventory.img"} <= set(names)
        f = tar.extractfile("config.dump")
        assert f is not None
        config = json.load(f)
        f = tar.extractfile("rootfs-diff.tar")
        assert f is not None
        with tarfile.open(fileobj=io.BytesIO(f.read())) as diff:
            assert "work/count" in diff.getnames()
    assert config["id"] == rec.id and config["name"] == rec.name
    assert config["rootfsImage"] == "busybox"
    assert config["rootfsImageName"] == "reg/busybox:latest"
    assert config["rootfsImageRef"] == rec.image_id and config["runtime"] == "runc"
    assert config["createdTime"] == "2023-11-14T22:13:20.000000Z"


@pytest.mark.parametrize("fail", ["criu", "timeout"])
async def test_a_failed_dump_thaws_and_leaves_nothing(tmp_path: Path, fail: str) -> None:
    rt = CheckpointRuntime(fail)
    parts = tmp_path / "parts"
    parts.mkdir()
    location = tmp_path / "c.tar"
    error = DeadlineExceeded if fail == "timeout" else FailedPrecondition
    with pytest.raises(error) as err:
        await checkpoint_container(container_record(tmp_path), rt, str(parts), str(location), 1)
    if fail == "criu":
        assert "CRIU said: (00.02) Error (criu/files.c:1): no way" in str(err.value)
    assert rt.calls == ["pause", "checkpoint", "resume"] and not rt.paused
    assert os.listdir(parts) == [] and not location.exists()


async def test_only_a_running_container_and_never_over_a_file(tmp_path: Path) -> None:
    rt = CheckpointRuntime()
    parts = tmp_path / "parts"
    parts.mkdir()
    with pytest.raises(FailedPrecondition, match="not running"):
        await checkpoint_container(container_record(tmp_path, EXITED), rt, str(parts),
                                   str(tmp_path / "c.tar"), 0)
    (tmp_path / "there.tar").write_text("mine")
    with pytest.raises(AlreadyExists):
        await checkpoint_container(container_record(tmp_path / "b"), rt, str(parts),
                                   str(tmp_path / "there.tar"), 0)
    assert (tmp_path / "there.tar").read_text() == "mine" and rt.calls == []


def test_leftovers_of_a_crash_are_cleared(tmp_path: Path) -> None:
    (tmp_path / "abc-1" / "checkpoint").mkdir(parents=True)
    (tmp_path / "abc-1" / "checkpoint" / "pages-1.img").write_bytes(b"x")
    clear_leftovers(str(tmp_path))
    assert os.listdir(tmp_path) == []
