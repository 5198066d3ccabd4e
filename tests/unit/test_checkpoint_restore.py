"""Restore from a checkpoint archive, which is untrusted input: its base image read from
config.dump, only the members restore needs unpacked (regular files, CRIU's images flat),
and its writable-layer diff written inside the new rootfs whatever its paths and links
say (no member lands outside, devices are skipped, deleted files are removed only inside)."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container import restore
from crishim.errors import FailedPrecondition, InvalidArgument
from tests.fakes.checkpoints import checkpoint_archive, tar_bytes, tar_info


def _config(image: str) -> pb.ContainerConfig:
    return pb.ContainerConfig(metadata=pb.ContainerMetadata(name="r"),
                              image=pb.ImageSpec(image=image), command=["sh"])


async def test_the_base_image_comes_from_config_dump_and_nothing_else(tmp_path: Path) -> None:
    archive = checkpoint_archive(tmp_path, tar_bytes([]))
    source, config = await restore.source_of(_config(str(archive)))
    assert source is not None and source.archive == str(archive)
    assert config.image.image == "sha256:" + "a" * 64 and list(config.command) == ["sh"]
    same = _config("busybox")
    assert await restore.source_of(same) == (None, same)


@pytest.mark.parametrize("config,words", [
    ({"id": "x"}, "names no image"),
    ({"rootfsImageRef": "/var/lib/other.tar"}, "names no image"),
    (["not", "a", "dict"], "names no image"),
])
async def test_a_config_dump_without_a_base_image_is_refused(tmp_path: Path, config: object,
                                                             words: str) -> None:
    archive = checkpoint_archive(tmp_path, tar_bytes([]), config=config)
    with pytest.raises(InvalidArgument, match=words):
        await restore.source_of(_config(str(archive)))


async def test_what_is_no_archive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="No such file"):
        await restore.source_of(_config(str(tmp_path / "none.tar")))
    with pytest.raises(InvalidArgument, match="not a regular file"):
        await restore.source_of(_config(str(tmp_path)))
    (tmp_path / "junk.tar").write_bytes(b"\x00junk" * 300)
    with pytest.raises(InvalidArgument):
        await restore.source_of(_config(str(tmp_path / "junk.tar")))
    empty = tmp_path / "empty.tar"
    empty.write_bytes(tar_bytes([(tar_info("spec.dump"), b"{}")]))
    with pytest.raises(InvalidArgument, match=r"no config\.dump"):
        await restore.source_of(_config(str(empty)))


def test_only_what_restore_needs_is_unpacked(tmp_path: Path) -> None:
    extra = [(tar_info("../escape"), b"x"), (tar_info("/abs"), b"x"),
             (tar_info("checkpoint/sub/deep.img"), b"x"),
             (tar_info("checkpoint/link.img", tarfile.SYMTYPE, "/etc/shadow"), b""),
             (tar_info("bind.mounts"), b'[{"source": "/"}]')]
    archive = checkpoint_archive(tmp_path, tar_bytes([]), extra=extra[:3] + extra[4:],
                                 deleted=["/etc/group"])
    dest = tmp_path / "dest"
    assert restore.unpack(str(archive), str(dest)) == ["/etc/group"]
    assert sorted(os.listdir(dest)) == ["checkpoint", "rootfs-diff.tar"]
    assert sorted(os.listdir(dest / "checkpoint")) == ["inventory.img", "pages-1.img"]
    assert not (tmp_path / "escape").exists()
    # An image that is a link (CRIU would follow it) is refused outright.
    archive = checkpoint_archive(tmp_path, tar_bytes([]), extra=[extra[3]])
    with pytest.raises(InvalidArgument, match="not a regular file"):
        restore.unpack(str(archive), str(tmp_path / "dest2"))
    archive = checkpoint_archive(tmp_path, tar_bytes([]), deleted={"not": "a list"})
    with pytest.raises(InvalidArgument, match="not a list"):
        restore.unpack(str(archive), str(tmp_path / "dest3"))


def test_the_diff_lands_inside_the_rootfs_whatever_it_says(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "group").write_text("root:x:0:\n")
    (rootfs / "bin").mkdir()
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "secret").write_text("host")
    diff = tmp_path / "diff.tar"
    diff.write_bytes(tar_bytes([
        (tar_info("work", tarfile.DIRTYPE, mode=0o755), b""),
        (tar_info("work/count", mode=0o640), b"41\n"),
        (tar_info("work/hard", tarfile.LNKTYPE, "work/count"), b""),
        # A link out of the rootfs, then a file "through" it: lands in the rootfs.
        (tar_info("up", tarfile.SYMTYPE, str(outside)), b""),
        (tar_info("../host/secret"), b"overwritten"),
        (tar_info("/abs"), b"x"),
        (tar_info("bin/dev", tarfile.CHRTYPE), b""),
        (tar_info("bin/hostlink", tarfile.LNKTYPE, "../../host/secret"), b""),
    ]))
    restore.apply_rootfs(str(rootfs), str(diff),
                         ["/etc/group", "/../host/secret", "/up/secret", "/no/such"])
    assert (outside / "secret").read_text() == "host"
    assert (rootfs / "work" / "count").read_text() == "41\n"
    assert (rootfs / "work" / "count").stat().st_mode & 0o777 == 0o640
    assert (rootfs / "work" / "hard").stat().st_ino == (rootfs / "work" / "count").stat().st_ino
    assert os.readlink(rootfs / "up") == str(outside)
    assert not (rootfs / "etc" / "group").exists()
    assert not (rootfs / "bin" / "dev").exists() and not (rootfs / "abs").exists()
    assert not (rootfs / "bin" / "hostlink").exists()
    # A file "through" the link: its directory is resolved in the rootfs, where the link
    # leads nowhere, and the restore is refused.
    diff.write_bytes(tar_bytes([(tar_info("up/secret"), b"overwritten")]))
    with pytest.raises(InvalidArgument, match="cannot be applied"):
        restore.apply_rootfs(str(rootfs), str(diff), [])
    assert (outside / "secret").read_text() == "host"


def test_prepare_keeps_restored_processes_in_the_new_cgroup(tmp_path: Path) -> None:
    """CRIU is told to leave cgroups alone (its images name the checkpointed container's),
    through the file runc hands it: the spec's org.criu.config annotation."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"annotations": {"a": "b"}}))
    images = restore.prepare(str(bundle / "rootfs"), str(bundle),
                             str(checkpoint_archive(tmp_path, tar_bytes([]))))
    assert sorted(os.listdir(images)) == ["inventory.img", "pages-1.img"]
    conf = bundle / restore.CRIU_CONF
    assert conf.read_text() == "manage-cgroups=ignore\n"
    spec = json.loads((bundle / "config.json").read_text())
    assert spec["annotations"] == {"a": "b", "org.criu.config": str(conf)}
