"""What CreateContainer prepares (crishim/container/build.py), with a plain directory for
the overlay rootfs: the image's user resolved from its own /etc/passwd, the log path under
the pod's log directory, a private termination log owned by the container's user, the
image's stop signal, and the spec written into the bundle."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.container import build
from crishim.container.build import ContainerPaths, build_container
from crishim.container.spec import TERMINATION_MESSAGE_ANNOTATION, SpecHost
from crishim.errors import InvalidArgument
from crishim.image import rootfs as rootfs_mod
from crishim.image.store import Image
from crishim.store.container import CREATED
from crishim.store.sandbox import READY, Sandbox

CID = "c" * 64
DIGEST = "registry.test/app@sha256:" + "d" * 64


@pytest.fixture
def made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    rootfs = tmp_path / "image-rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n"
                                       "app:x:1000:1001::/home/app:/bin/sh\n")
    (rootfs / "etc/group").write_text("root:x:0:\napp:x:1001:\nextra:x:2000:app\n")

    async def plain(layer_dirs: list[str], bundle: str, idmapped: Any = None) -> str:
        return str(rootfs)

    monkeypatch.setattr(rootfs_mod, "mount_rootfs", plain)
    monkeypatch.setattr(build, "crash_point", lambda step: None)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    sb = Sandbox(id="p" * 64, name="web_ns_uid_0", runtime_handler="runc", created_at=1,
                 state=READY, config=pb.PodSandboxConfig(
                     metadata=pb.PodSandboxMetadata(name="web", namespace="ns", uid="uid"),
                     log_directory=str(tmp_path / "logs")))
    image = Image(id="sha256:" + "ab" * 32, repo_tags=["registry.test/app:v1"],
                  repo_digests=[DIGEST], size=0, layer_dirs=[],
                  config={"config": {"User": "app", "StopSignal": "SIGUSR1",
                                     "Cmd": ["sleep", "3600"]}})
    return SimpleNamespace(tmp=tmp_path, bundle=bundle, sb=sb, image=image)


def config(**kw: Any) -> pb.ContainerConfig:
    return pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                              image=pb.ImageSpec(image="registry.test/app:v1"), **kw)


async def make(m: SimpleNamespace, cfg: pb.ContainerConfig) -> Any:
    paths = ContainerPaths(CID, str(m.bundle), str(m.tmp / "persist"))
    return await build_container(paths, "app_web_ns_uid_0", m.sb, cfg, m.image, "runc",
                                 SpecHost(), SimpleNamespace())  # type: ignore[arg-type]


async def test_the_record_and_bundle_of_a_container(made: SimpleNamespace) -> None:
    rec = await make(made, config(log_path="app/0.log", annotations={
        TERMINATION_MESSAGE_ANNOTATION: "/dev/termination-log"}))
    assert rec.state == CREATED and rec.id == CID and rec.pod_id == made.sb.id
    assert (rec.uid, rec.gid) == (1000, 1001) and rec.gids == [1001, 2000]
    assert rec.log_path == str(made.tmp / "logs" / "app/0.log")
    assert rec.stop_signal == signal.SIGUSR1
    assert rec.image_ref == DIGEST and rec.image_name == "registry.test/app:v1"
    spec = json.loads((made.bundle / "config.json").read_text())
    assert spec["process"]["user"]["uid"] == 1000 and spec["process"]["args"] == [
        "sleep", "3600"]
    st = os.stat(rec.termination_log)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1001, 0o600)


async def test_the_cri_stop_signal_wins_over_the_images(made: SimpleNamespace) -> None:
    rec = await make(made, config(stop_signal=pb.SIGINT))
    assert rec.stop_signal == signal.SIGINT and rec.termination_log == ""


@pytest.mark.parametrize("log_path", ["../escape.log", "/abs.log"])
async def test_a_log_path_outside_the_pods_directory_is_refused(
        made: SimpleNamespace, log_path: str) -> None:
    with pytest.raises(InvalidArgument, match="log_path"):
        await make(made, config(log_path=log_path))
    assert not (made.bundle / "config.json").exists()
