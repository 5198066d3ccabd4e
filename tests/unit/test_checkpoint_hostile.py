"""Hostile checkpoints: an archive or a pod checkpoint directory is untrusted input. Its
sizes are bounded, its spec and mounts never reach the restored container (the request's
security settings do), and a pod checkpoint's archives are only regular files directly in
its directory, matched to the request's containers by name."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container import podckpt, restore
from crishim.errors import FailedPrecondition, InvalidArgument
from tests.fakes.checkpoints import checkpoint_archive, tar_bytes, tar_info


def test_sizes_and_counts_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    member = (tar_info("checkpoint/big.img"), b"x" * 4096)
    archive = checkpoint_archive(tmp_path, tar_bytes([]), extra=[member])
    monkeypatch.setattr(restore, "MAX_TOTAL", 4000)
    with pytest.raises(InvalidArgument, match="larger than 4000 bytes"):
        restore.unpack(str(archive), str(tmp_path / "d1"))
    monkeypatch.setattr(restore, "MAX_TOTAL", 1 << 30)
    monkeypatch.setattr(restore, "MAX_MEMBERS", 3)
    with pytest.raises(InvalidArgument, match="more than 3 members"):
        restore.unpack(str(archive), str(tmp_path / "d2"))
    monkeypatch.setattr(restore, "MAX_MEMBERS", 200_000)
    big = checkpoint_archive(tmp_path, tar_bytes([]), deleted=["/x" * 40])
    monkeypatch.setattr(restore, "MAX_JSON", 60)
    with pytest.raises(InvalidArgument, match="at most 60 bytes"):
        restore.unpack(str(big), str(tmp_path / "d3"))


async def test_the_request_decides_everything_but_the_image(tmp_path: Path) -> None:
    """spec.dump asks for privileges, host mounts and another command: none is taken."""
    archive = checkpoint_archive(tmp_path, tar_bytes([]), extra=[
        (tar_info("spec.dump"), json.dumps({
            "process": {"args": ["/bin/evil"], "user": {"uid": 0},
                        "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}},
            "mounts": [{"source": "/", "destination": "/host", "type": "bind"}],
            "linux": {"namespaces": []}}).encode()),
        (tar_info("bind.mounts"), b'[{"source": "/", "destination": "/host"}]')])
    asked = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="r"), image=pb.ImageSpec(image=str(archive)),
        command=["sh"], linux=pb.LinuxContainerConfig(
            security_context=pb.LinuxContainerSecurityContext(
                run_as_user=pb.Int64Value(value=1000), readonly_rootfs=True,
                capabilities=pb.Capability(drop_capabilities=["ALL"]))))
    _, config = await restore.source_of(asked)
    expected = pb.ContainerConfig()
    expected.CopyFrom(asked)
    expected.image.image = "sha256:" + "a" * 64
    assert config == expected


def _pod(tmp: Path, containers: object, files: dict[str, bytes] | None = None) -> Path:
    d = tmp / "podckpt"
    d.mkdir()
    (d / podckpt.POD_DUMP).write_text(json.dumps({"containers": containers}))
    for name, data in (files or {}).items():
        (d / name).write_bytes(data)
    return d


ID = "ab" * 32


def test_a_pod_checkpoint_names_its_archives_and_nothing_else(tmp_path: Path) -> None:
    d = _pod(tmp_path, [{"name": "web", "archive": f"{ID}.tar"}], {f"{ID}.tar": b"tar"})
    assert podckpt.read_pod_dump(str(d)) == {"web": str(d / f"{ID}.tar")}
    podckpt.match(str(d), {"web": "x"}, ["web"])
    for names, words in ((["web", "db"], "not in the checkpoint: db"),
                         ([], "not in the request: web")):
        with pytest.raises(InvalidArgument, match=words):
            podckpt.match(str(d), {"web": "x"}, names)


@pytest.mark.parametrize("archive", ["../" + ID + ".tar", "/etc/shadow", ID + ".tar/x",
                                     "web.tar", 7])
def test_a_pod_checkpoint_archive_outside_its_directory_is_refused(
        tmp_path: Path, archive: object) -> None:
    d = _pod(tmp_path, [{"name": "web", "archive": archive}])
    with pytest.raises(InvalidArgument, match=r"not <id>\.tar"):
        podckpt.read_pod_dump(str(d))


def test_links_and_junk_in_a_pod_checkpoint_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.tar"
    outside.write_bytes(b"tar")
    d = _pod(tmp_path, [{"name": "web", "archive": f"{ID}.tar"}])
    os.symlink(outside, d / f"{ID}.tar")
    with pytest.raises(InvalidArgument, match="not a regular file"):
        podckpt.read_pod_dump(str(d))
    os.unlink(d / f"{ID}.tar")
    with pytest.raises(InvalidArgument, match="missing"):
        podckpt.read_pod_dump(str(d))
    # pod.dump itself: never through a link, bounded, JSON, names once.
    dump = d / podckpt.POD_DUMP
    dump.unlink()
    with pytest.raises(FailedPrecondition, match=r"no pod\.dump"):
        podckpt.read_pod_dump(str(d))
    os.symlink(outside, dump)
    with pytest.raises(InvalidArgument, match=r"pod\.dump"):
        podckpt.read_pod_dump(str(d))
    dump.unlink()
    dump.write_bytes(b" " * (podckpt.MAX_POD_DUMP + 1))
    with pytest.raises(InvalidArgument, match="larger than"):
        podckpt.read_pod_dump(str(d))
    for value in ("{", '{"containers": []}', '{"containers": [{"name": "a", '
                  f'"archive": "{ID}.tar"}}, {{"name": "a", "archive": "{ID}.tar"}}]}}'):
        dump.write_text(value)
        (d / f"{ID}.tar").write_bytes(b"tar")
        with pytest.raises(InvalidArgument):
            podckpt.read_pod_dump(str(d))
