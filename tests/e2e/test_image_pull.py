"""ImageService against a real docker-registry: pull (OCI, Docker, zstd, multi-arch,
whiteouts), list/status/remove semantics, fs info, restart persistence."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e import imagebuild as ib
from tests.e2e.daemon import Daemon, running_daemon
from tests.e2e.registry import Registry, TokenProxy


def config(certs_d: str = "/nonexistent") -> str:
    return f'[registry]\nconfig_path = "{certs_d}"\n'


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon(config()) as d:
        yield d


def spec(image: str) -> pb.ImageSpec:
    return pb.ImageSpec(image=image)


def pull(d: Daemon, ref: str, auth: pb.AuthConfig | None = None) -> str:
    req = pb.PullImageRequest(image=spec(ref), auth=auth)
    return str(d.images().PullImage(req, timeout=120).image_ref)


def status(d: Daemon, ref: str, verbose: bool = False) -> pb.ImageStatusResponse:
    return d.images().ImageStatus(pb.ImageStatusRequest(image=spec(ref), verbose=verbose))


def layer_dirs(d: Daemon, ref: str) -> list[str]:
    info = json.loads(status(d, ref, verbose=True).info["info"])
    return list(info["layerDirs"])


def busybox_sha() -> str:
    return hashlib.sha256(Path("/usr/bin/busybox").read_bytes()).hexdigest()


def test_pull_list_status(daemon: Daemon, registry: Registry) -> None:
    img = ib.build_busybox(config_overrides={"User": "1000", "WorkingDir": "/tmp"})
    digest = ib.push_image(registry.host, "pull/basic", "v1", img)
    ref = f"{registry.host}/pull/basic:v1"
    assert pull(daemon, ref) == img.image_id  # image ref = image ID, as containerd

    listed = {i.id: i for i in daemon.images().ListImages(pb.ListImagesRequest()).images}
    got = listed[img.image_id]
    assert list(got.repo_tags) == [ref]
    assert list(got.repo_digests) == [f"{registry.host}/pull/basic@{digest}"]
    assert got.size >= img.size and got.uid.value == 1000 and got.username == ""

    st = status(daemon, ref, verbose=True)
    assert st.image.id == img.image_id
    info = json.loads(st.info["info"])
    assert info["imageSpec"]["config"]["Cmd"] == ["sh"]
    assert info["imageSpec"]["config"]["WorkingDir"] == "/tmp"
    [base] = layer_dirs(daemon, ref)
    assert hashlib.sha256(Path(base, "bin/busybox").read_bytes()).hexdigest() == busybox_sha()
    assert os.readlink(Path(base, "bin/sh")) == "busybox"
    assert Path(base, "tmp").stat().st_mode & 0o7777 == 0o1777
    assert Path(base, "home/app").stat().st_uid == 1000

    # the same image found by ID, bare hex, short prefix, digest reference
    for key in (img.image_id, img.image_id[7:], img.image_id[7:19],
                f"{registry.host}/pull/basic@{digest}"):
        assert status(daemon, key).image.id == img.image_id, key
    # filter
    flt = pb.ImageFilter(image=spec(ref))
    assert [i.id for i in daemon.images().ListImages(
        pb.ListImagesRequest(filter=flt)).images] == [img.image_id]
    assert not daemon.images().ListImages(
        pb.ListImagesRequest(filter=pb.ImageFilter(image=spec("nope/nothing")))).images
    # StreamImages: same content as ListImages
    streamed = [i.id for r in daemon.images().StreamImages(pb.StreamImagesRequest())
                for i in r.images]
    assert sorted(streamed) == sorted(listed)


@pytest.mark.parametrize(("media", "compression"), [("docker", "gzip"), ("oci", "zstd"),
                                                    ("oci", "none")])
def test_media_types_and_compression(daemon: Daemon, registry: Registry, media: str,
                                     compression: str) -> None:
    img = ib.build_busybox(extra_layers=[[ib.file("etc/kind", f"{media}-{compression}")]],
                           media=media, compression=compression)  # type: ignore[arg-type]
    ib.push_image(registry.host, f"pull/{media}-{compression}", "v1", img)
    ref = f"{registry.host}/pull/{media}-{compression}:v1"
    assert pull(daemon, ref) == img.image_id
    base, top = layer_dirs(daemon, ref)
    assert Path(top, "etc/kind").read_text() == f"{media}-{compression}"
    assert hashlib.sha256(Path(base, "bin/busybox").read_bytes()).hexdigest() == busybox_sha()


@pytest.mark.parametrize("media", ["oci", "docker"])
def test_multiarch_index_picks_host_platform(daemon: Daemon, registry: Registry,
                                             media: str) -> None:
    ma = ib.push_multiarch(registry.host, f"pull/multi-{media}", "v1", media=media)  # type: ignore[arg-type]
    ref = f"{registry.host}/pull/multi-{media}:v1"
    assert pull(daemon, ref) == ma.host_image.image_id
    st = status(daemon, ref).image
    # repo digest is the index digest (what the tag points at), as containerd reports it
    assert f"{registry.host}/pull/multi-{media}@{ma.index_digest}" in st.repo_digests
    top = layer_dirs(daemon, ref)[-1]
    assert Path(top, "ARCH").read_text() == "linux/" + ib.host_arch()


def test_whiteouts_give_the_right_rootfs(daemon: Daemon, registry: Registry) -> None:
    img = ib.push_whiteout_image(registry.host, "pull/whiteout", "v1")
    ref = f"{registry.host}/pull/whiteout:v1"
    assert pull(daemon, ref) == img.image_id
    lowers = ":".join(reversed(layer_dirs(daemon, ref)))
    with tempfile.TemporaryDirectory() as mnt:
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lowers}", mnt],
                       check=True)
        try:
            root = Path(mnt)
            assert (root / "data/keep").read_text() == "keep"
            assert not (root / "data/gone").exists()
            assert not (root / "data/sub").exists()
            assert sorted(os.listdir(root / "opq")) == ["c"]
            assert os.readlink(root / "data/link") == "keep"
            assert (root / "data/hard").stat().st_ino == (root / "data/keep").stat().st_ino
            conf = (root / "etc/app.conf").stat()
            assert (conf.st_uid, conf.st_gid, conf.st_mode & 0o777) == (1000, 1000, 0o640)
            assert (root / "bin/busybox").exists()
        finally:
            subprocess.run(["umount", mnt], check=True)


def test_errors(daemon: Daemon, registry: Registry) -> None:
    # missing image: empty status, no error (CRI)
    assert not status(daemon, f"{registry.host}/pull/none:v1").HasField("image")
    assert not status(daemon, "sha256:" + "0" * 64).HasField("image")
    with pytest.raises(grpc.RpcError) as exc:
        pull(daemon, "Bad/Upper:case")
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "lowercase" in (exc.value.details() or "")
    with pytest.raises(grpc.RpcError) as exc:
        pull(daemon, "")
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as exc:
        pull(daemon, f"{registry.host}/pull/none:v1")
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND


def test_foreign_layer_refused(daemon: Daemon, registry: Registry) -> None:
    img = ib.build_image([ib.busybox_layer_tar(), [ib.file("x", "x")]], layer_media_types=[
        None, "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"])
    manifest = json.loads(img.manifest.data)
    manifest["layers"][1]["urls"] = ["https://example.invalid/layer"]
    img.manifest = ib.Blob(img.manifest.media_type, json.dumps(manifest).encode())
    ib.push_image(registry.host, "pull/foreign", "v1", img)
    with pytest.raises(grpc.RpcError) as exc:
        pull(daemon, f"{registry.host}/pull/foreign:v1")
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "non-distributable" in (exc.value.details() or "")


def test_unsafe_layer_refused_naming_image_layer_and_member(daemon: Daemon,
                                                           registry: Registry) -> None:
    img = ib.build_image([ib.busybox_layer_tar(), [ib.file("../escape", "x")]])
    ib.push_image(registry.host, "pull/unsafe", "v1", img)
    ref = f"{registry.host}/pull/unsafe:v1"
    with pytest.raises(grpc.RpcError) as exc:
        pull(daemon, ref)
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = exc.value.details() or ""
    assert ref in details and img.layers[1].digest in details and "../escape" in details


def test_artifact_is_not_an_image(daemon: Daemon, registry: Registry) -> None:
    img = ib.build_image([[ib.file("chart.yaml", "name: x")]])
    img.config = ib.Blob("application/vnd.cncf.helm.config.v1+json", img.config.data)
    manifest = json.loads(img.manifest.data)
    manifest["config"]["mediaType"] = img.config.media_type
    img.manifest = ib.Blob(img.manifest.media_type, json.dumps(manifest).encode())
    ib.push_image(registry.host, "pull/chart", "v1", img)
    with pytest.raises(grpc.RpcError) as exc:
        pull(daemon, f"{registry.host}/pull/chart:v1")
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not a container image" in (exc.value.details() or "")


def test_remove_semantics(registry: Registry) -> None:
    img = ib.build_busybox(extra_layers=[[ib.file("rm", "rm")]])
    for tag in ("a", "b"):
        ib.push_image(registry.host, "pull/rm", tag, img)
    ref_a, ref_b = f"{registry.host}/pull/rm:a", f"{registry.host}/pull/rm:b"
    with running_daemon(config()) as d:
        assert pull(d, ref_a) == pull(d, ref_b) == img.image_id
        assert sorted(status(d, ref_a).image.repo_tags) == [ref_a, ref_b]
        dirs = layer_dirs(d, ref_a)
        assert dirs and all(os.path.isdir(p) for p in dirs), dirs
        # one tag: only that tag goes
        d.images().RemoveImage(pb.RemoveImageRequest(image=spec(ref_a)))
        assert not status(d, ref_a).HasField("image")
        assert list(status(d, ref_b).image.repo_tags) == [ref_b]
        # by ID: everything goes, layers too
        d.images().RemoveImage(pb.RemoveImageRequest(image=spec(img.image_id)))
        assert not status(d, ref_b).HasField("image")
        assert not d.images().ListImages(pb.ListImagesRequest()).images
        assert not any(os.path.exists(p) for p in dirs)
        # idempotent, also for never-seen images and IDs
        d.images().RemoveImage(pb.RemoveImageRequest(image=spec(img.image_id)))
        d.images().RemoveImage(pb.RemoveImageRequest(image=spec("never/seen:x")))
        # a retag moves the tag: pulling a new image under :a untags the old one
        assert pull(d, ref_a) == img.image_id
        other = ib.build_busybox(extra_layers=[[ib.file("rm", "other")]])
        ib.push_image(registry.host, "pull/rm", "a", other)
        assert pull(d, ref_a) == other.image_id
        old = status(d, img.image_id).image
        assert ref_a not in old.repo_tags


def test_fs_info_and_restart(registry: Registry, busybox_ref: str) -> None:
    with running_daemon(config()) as d:
        image_id = pull(d, busybox_ref)
        fs = d.images().ImageFsInfo(pb.ImageFsInfoRequest())
        [imgfs] = fs.image_filesystems
        assert imgfs.used_bytes.value > 1_000_000  # busybox is ~1-2 MB unpacked
        assert imgfs.inodes_used.value > 100  # one symlink per applet
        assert os.path.ismount(imgfs.fs_id.mountpoint)
        assert d.root.startswith(imgfs.fs_id.mountpoint)
        assert len(fs.container_filesystems) == 1
        d.stop()
        d.start()
        assert status(d, busybox_ref).image.id == image_id
        assert status(d, image_id).image.repo_tags == [busybox_ref]


def test_concurrent_pulls_share_one_download(registry: Registry) -> None:
    img = ib.build_busybox(extra_layers=[[ib.file("c", "c")]])
    ib.push_image(registry.host, "pull/concurrent", "v1", img)
    with TokenProxy(registry.host) as proxy, running_daemon(config()) as d:
        ref = f"{proxy.host}/pull/concurrent:v1"
        results: list[str] = []
        threads = [threading.Thread(target=lambda: results.append(pull(d, ref)))
                   for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "a pull did not return within 120s"
        assert results == [img.image_id] * 6
        blob_gets = [p for m, p, _ in proxy.requests if m == "GET" and "/blobs/" in p]
        assert len(blob_gets) == len(set(blob_gets)) == 3  # config + 2 layers, once each

        # Another image on the same base: the base layer is not fetched again. Pulled by
        # digest: no repo tag, just the repo digest.
        other = ib.build_busybox(extra_layers=[[ib.file("c", "other")]])
        digest = ib.push_image(registry.host, "pull/concurrent", "v2", other)
        proxy.requests.clear()
        by_digest = f"{proxy.host}/pull/concurrent@{digest}"
        assert pull(d, by_digest) == other.image_id
        fetched = {p.rsplit("/", 1)[1] for m, p, _ in proxy.requests if "/blobs/" in p}
        assert img.layers[0].digest not in fetched
        assert other.layers[1].digest in fetched
        st = status(d, by_digest).image
        assert list(st.repo_tags) == [] and list(st.repo_digests) == [by_digest]


def test_runtime_handler_on_image_calls(daemon: Daemon, registry: Registry) -> None:
    """RuntimeClassInImageCriApi: the kubelet names the pod's handler on image calls."""
    img = ib.build_busybox(extra_layers=[[ib.file("rh", "rh")]])
    ib.push_image(registry.host, "pull/handler", "v1", img)
    ref = f"{registry.host}/pull/handler:v1"

    def pull_for(handler: str) -> str:
        req = pb.PullImageRequest(image=pb.ImageSpec(image=ref, runtime_handler=handler))
        return str(daemon.images().PullImage(req, timeout=120).image_ref)

    def listed(handler: str = "") -> list[str]:
        flt = pb.ImageFilter(image=pb.ImageSpec(image=ref, runtime_handler=handler))
        return [i.spec.runtime_handler for i in daemon.images().ListImages(
            pb.ListImagesRequest(filter=flt)).images if i.id == img.image_id]

    assert pull_for("crun") == img.image_id
    assert listed() == ["crun"]
    st = daemon.images().ImageStatus(pb.ImageStatusRequest(
        image=pb.ImageSpec(image=ref, runtime_handler="crun"))).image
    assert (st.spec.image, st.spec.runtime_handler) == (img.image_id, "crun")
    assert pull_for("") == img.image_id
    assert listed() == ["crun", ""] and listed("crun") == ["crun"]
    # An unknown handler is the caller's mistake, named as such.
    with pytest.raises(grpc.RpcError) as err:
        pull_for("nope")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "runtime handler 'nope'" in (err.value.details() or "")
    # Removing for one handler leaves the image for the other; then it goes.
    daemon.images().RemoveImage(pb.RemoveImageRequest(
        image=pb.ImageSpec(image=img.image_id, runtime_handler="crun")))
    assert listed() == [""]
    daemon.images().RemoveImage(pb.RemoveImageRequest(image=spec(img.image_id)))
    assert not status(daemon, ref).HasField("image")
