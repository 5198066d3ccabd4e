"""Checkpoint archives and an OCI runtime that pretends to checkpoint, shared by the
checkpoint and restore unit tests."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.runtime.runc import OCIRuntime, OCIRuntimeError
from crishim.store.container import RUNNING, Container

SPEC = {"process": {"args": ["sh"]},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts",
                    "options": ["rbind", "ro"]},
                   {"destination": "/data", "type": "bind", "source": "/tmp",
                    "options": ["rbind"]}]}


def upper_dir(root: Path) -> Path:
    up = root / "upper"
    (up / "etc").mkdir(parents=True)
    (up / "etc" / "hosts").write_text("")  # the runtime's mount point
    (up / "data").mkdir()  # ditto
    (up / "proc").mkdir()
    (up / "work").mkdir()
    (up / "work" / "count").write_text("41\n")
    (up / "work" / "link").symlink_to("count")
    os.mknod(up / "etc" / "group", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout
    return up


def fake_dump(image_path: str, work_path: str) -> None:
    os.makedirs(image_path)
    Path(image_path, "inventory.img").write_bytes(b"img")
    Path(work_path, "dump.log").write_text(
        "(00.01) Dumping\n(00.02) Error (criu/files.c:1): no way\n")


class CheckpointRuntime(OCIRuntime):
    def __init__(self, fail: str = "") -> None:
        super().__init__("runc", "runc", "/nonexistent")
        self.fail = fail
        self.calls: list[str] = []
        self.paused = False

    async def pause(self, cid: str) -> None:
        self.calls.append("pause")
        self.paused = True

    async def resume(self, cid: str) -> None:
        self.calls.append("resume")
        self.paused = False

    async def state(self, cid: str) -> dict[str, Any] | None:
        return {"status": "paused" if self.paused else "running"}

    async def checkpoint(self, cid: str, image_path: str, work_path: str,
                         timeout: float | None = None) -> None:  # noqa: ASYNC109
        self.calls.append("checkpoint")
        fake_dump(image_path, work_path)
        if self.fail == "timeout":
            raise OCIRuntimeError("runc checkpoint timed out after 1s")
        if self.fail:
            raise OCIRuntimeError("runc checkpoint failed (exit 1): criu failed")


def container_record(tmp: Path, state: pb.ContainerState = RUNNING) -> Container:
    bundle = tmp / "bundle"
    upper_dir(bundle)
    (bundle / "config.json").write_text(json.dumps(SPEC))
    log = tmp / "c.log"
    log.write_text("2026-01-01T00:00:00Z stdout F 41\n")
    return Container(id="c" * 64, pod_id="p", name="counter_pod_ns_uid_0",
                     config=pb.ContainerConfig(image=pb.ImageSpec(image="busybox")),
                     runtime_handler="", created_at=1_700_000_000_000_000_000,
                     image_name="reg/busybox:latest", image_id="sha256:" + "a" * 64,
                     image_ref="sha256:" + "a" * 64, bundle=str(bundle), rootfs="",
                     persist_dir="", log_path=str(log), state=state)


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def tar_info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "",
          mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = mode
    return info


def checkpoint_archive(tmp: Path, diff: bytes,
                       extra: list[tuple[tarfile.TarInfo, bytes]] | None = None,
                       config: object = None, deleted: object = None) -> Path:
    members = [(tar_info("config.dump"), json.dumps(
        config if config is not None else {"id": "x", "rootfsImageRef": "sha256:" + "a" * 64,
                                           "rootfsImageName": "reg/busybox:latest"}).encode()),
               (tar_info("spec.dump"), b'{"mounts": [{"source": "/etc/shadow"}]}'),
               (tar_info("checkpoint", tarfile.DIRTYPE), b""),
               (tar_info("checkpoint/inventory.img"), b"inv"),
               (tar_info("checkpoint/pages-1.img"), b"pages"),
               (tar_info("rootfs-diff.tar"), diff)]
    if deleted is not None:
        members.append((tar_info("deleted.files"), json.dumps(deleted).encode()))
    path = tmp / "c.tar"
    path.write_bytes(tar_bytes(members + (extra or [])))
    return path
