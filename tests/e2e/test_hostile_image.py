"""Hostile images and registries, through the real socket: nothing an image or a registry
says reaches the host outside crishim's roots.

Each case pulls something crafted (pushed to a real docker-registry when that registry
accepts it, else served by `Hostile`, a registry that answers whatever the test says) and
asserts that a canary directory outside the daemon's roots is exactly as before (nothing
read into an image, written or removed), that a refused pull names the image and the
field, and that the image store keeps no trace of it (tmp/ empty, every layer dir marked
verified). One daemon for the module, with a low registry.max_layer_uncompressed_size
for the decompression bomb.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e import imagebuild as ib
from tests.e2e.canary import Canary
from tests.e2e.daemon import Daemon, running_daemon
from tests.e2e.registry import QuietHandler, Registry

MAX_LAYER = 8 << 20  # the module daemon's registry.max_layer_uncompressed_size


def config() -> str:
    return ('[registry]\nconfig_path = "/nonexistent"\n'
            f"max_layer_uncompressed_size = {MAX_LAYER}\n")


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon(config()) as d:
        yield d


# --- the canary outside the roots ---------------------------------------------------------

@pytest.fixture(scope="module")
def canary_dir() -> Iterator[Canary]:
    d = tempfile.mkdtemp(prefix="crishim-canary-")
    os.makedirs(os.path.join(d, "sub"))
    with open(os.path.join(d, "secret"), "w") as fh:
        fh.write("host secret\n")
    with open(os.path.join(d, "sub", "nested"), "w") as fh:
        fh.write("nested\n")
    os.symlink("secret", os.path.join(d, "link"))
    try:
        yield Canary(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture()
def canary(canary_dir: Canary, daemon: Daemon) -> Iterator[Canary]:
    """The canary, checked untouched after the test, and the store checked clean."""
    before = canary_dir.snapshot()
    yield canary_dir
    assert canary_dir.snapshot() == before, "something outside the roots changed"
    assert_store_clean(daemon)


def assert_store_clean(d: Daemon) -> None:
    images = os.path.join(d.root, "images")
    assert os.listdir(os.path.join(images, "tmp")) == []
    layers = set(os.listdir(os.path.join(images, "layers")))
    assert layers == set(os.listdir(os.path.join(images, "verified")))
    for name in layers:
        assert not os.path.islink(os.path.join(images, "layers", name))


# --- pulling ------------------------------------------------------------------------------

def pull(d: Daemon, ref: str) -> str:
    req = pb.PullImageRequest(image=pb.ImageSpec(image=ref))
    return str(d.images().PullImage(req, timeout=60).image_ref)


def refused(d: Daemon, ref: str, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION
            ) -> str:
    with pytest.raises(grpc.RpcError) as info:
        pull(d, ref)
    assert info.value.code() == code, info.value.details()
    listed = d.images().ListImages(pb.ListImagesRequest()).images
    assert not any(ref in i.repo_tags for i in listed)
    return str(info.value.details())


def layer_dirs(d: Daemon, ref: str) -> list[str]:
    st = d.images().ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=ref),
                                                      verbose=True))
    return list(json.loads(st.info["info"])["layerDirs"])


def forged(img: ib.BuiltImage, *, diff_ids: list[str] | None = None,
           config_digest: str | None = None, layer_digests: list[str] | None = None
           ) -> ib.BuiltImage:
    """`img` with its config's diff IDs and/or its manifest's digests replaced."""
    cfg = json.loads(img.config.data)
    if diff_ids is not None:
        cfg["rootfs"]["diff_ids"] = diff_ids
    config = ib.Blob(img.config.media_type, json.dumps(cfg, sort_keys=True).encode())
    manifest = json.loads(img.manifest.data)
    manifest["config"] = config.descriptor()
    if config_digest is not None:
        manifest["config"]["digest"] = config_digest
    if layer_digests is not None:
        for desc, dig in zip(manifest["layers"], layer_digests, strict=True):
            desc["digest"] = dig
    return ib.BuiltImage(config, img.layers,
                         ib.Blob(img.manifest.media_type, json.dumps(manifest).encode()),
                         img.diff_ids, cfg)


def unique_layer(tag: str, *extra: ib.Entry) -> list[ib.Entry]:
    """A small layer no other test has (its own diff ID)."""
    return [ib.directory("data"), ib.file(f"data/{tag}", tag), *extra]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --- a registry that says whatever the test wants -----------------------------------------

@dataclass
class Hostile:
    """Serves `manifests[(repo, ref)]` and `blobs[digest]` as given, without checking
    anything; `requests` lists every path asked for."""

    manifests: dict[tuple[str, str], tuple[str, bytes]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def host(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.server_address[1]}"

    def add_image(self, repo: str, tag: str, img: ib.BuiltImage) -> None:
        for b in (img.config, *img.layers):
            self.blobs[b.digest] = b.data
        self.manifests[(repo, tag)] = (img.manifest.media_type, img.manifest.data)

    def start(self) -> Hostile:
        reg = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                reg.requests.append(self.path)
                path = self.path.split("?")[0]
                if path in ("/v2", "/v2/"):
                    self._send(200, b"{}", {"Content-Type": "application/json"})
                    return
                repo, kind, obj = "", "", ""
                for k in ("/manifests/", "/blobs/"):
                    if k in path:
                        repo, _, obj = path[len("/v2/"):].partition(k)
                        kind = k.strip("/")
                if kind == "manifests" and (repo, obj) in reg.manifests:
                    media, body = reg.manifests[(repo, obj)]
                    self._send(200, body, {"Content-Type": media,
                                           "Docker-Content-Digest": sha(body)})
                elif kind == "blobs" and obj in reg.blobs:
                    self._send(200, reg.blobs[obj],
                               {"Content-Type": "application/octet-stream"})
                else:
                    self._send(404, b'{"errors":[{"code":"NOT_FOUND"}]}',
                               {"Content-Type": "application/json"})

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    reg = Hostile().start()
    try:
        yield reg
    finally:
        reg.close()


def bad_digests(canary: str) -> dict[str, str]:
    hex64 = hashlib.sha256(canary.encode()).hexdigest()
    return {
        "dotdot": "sha256:../../../../../.." + canary,
        "absolute": "sha256:" + canary,
        "root": "sha256:/",
        "uppercase": "sha256:" + hex64.upper(),
        "short": "sha256:" + hex64[:-1],
        "long": "sha256:" + hex64 + "0",
        "unknown-algorithm": "md5:" + hex64[:32],
        "sha512-length-of-sha256": "sha512:" + hex64,
    }


BAD = list(bad_digests("/x"))


# --- the two reproductions of issue 45 ----------------------------------------------------

def test_diff_id_naming_a_host_dir_is_refused_and_not_read(
        daemon: Daemon, registry: Registry, canary: Canary) -> None:
    base = ib.build_image([ib.busybox_layer_tar(), unique_layer("read")])
    img = forged(base, diff_ids=[base.diff_ids[0], "sha256:" + canary.path])
    ib.push_image(registry.host, "hostile/read", "v1", img)
    msg = refused(daemon, f"{registry.host}/hostile/read:v1")
    assert "config rootfs.diff_ids[1] is not a valid digest" in msg
    assert "hostile/read" in msg


def test_failed_pull_naming_a_host_dir_removes_nothing(
        daemon: Daemon, registry: Registry, canary: Canary) -> None:
    base = ib.build_image([ib.busybox_layer_tar(), unique_layer("delete")])
    img = forged(base, diff_ids=["sha256:" + canary.path, "sha256:" + "0" * 64])
    ib.push_image(registry.host, "hostile/delete", "v1", img)
    msg = refused(daemon, f"{registry.host}/hostile/delete:v1")
    assert "config rootfs.diff_ids[0] is not a valid digest" in msg


@pytest.mark.parametrize("kind", BAD)
def test_bad_diff_ids_are_refused(daemon: Daemon, registry: Registry, canary: Canary,
                                  kind: str) -> None:
    bad = bad_digests(canary.path)[kind]
    base = ib.build_image([unique_layer(f"diffid-{kind}")])
    ib.push_image(registry.host, "hostile/diffid", kind, forged(base, diff_ids=[bad]))
    msg = refused(daemon, f"{registry.host}/hostile/diffid:{kind}")
    assert "config rootfs.diff_ids[0] is not a valid digest" in msg


def test_wrong_but_valid_diff_id_is_refused_after_download(
        daemon: Daemon, registry: Registry, canary: Canary) -> None:
    base = ib.build_image([unique_layer("wrong-hex")])
    ib.push_image(registry.host, "hostile/wrong", "v1",
                  forged(base, diff_ids=["sha256:" + "1" * 64]))
    msg = refused(daemon, f"{registry.host}/hostile/wrong:v1")
    assert "does not match the image config's diff ID" in msg


# --- digests from a hostile registry ------------------------------------------------------

def _never_asked(reg: Hostile, bad: str) -> None:
    """The bad digest never became part of a URL."""
    for path in reg.requests:
        assert "/.." not in path and bad not in path, path


@pytest.mark.parametrize("kind", BAD)
def test_bad_layer_digest_in_the_manifest(daemon: Daemon, hostile: Hostile, canary: Canary,
                                          kind: str) -> None:
    bad = bad_digests(canary.path)[kind]
    img = forged(ib.build_image([unique_layer("mlayer")]), layer_digests=[bad])
    hostile.add_image("h/layer", kind, img)
    msg = refused(daemon, f"{hostile.host}/h/layer:{kind}")
    assert "manifest layers[0].digest is not a valid digest" in msg
    _never_asked(hostile, bad)


@pytest.mark.parametrize("kind", BAD)
def test_bad_config_digest_in_the_manifest(daemon: Daemon, hostile: Hostile, canary: Canary,
                                           kind: str) -> None:
    bad = bad_digests(canary.path)[kind]
    img = forged(ib.build_image([unique_layer("mconfig")]), config_digest=bad)
    hostile.add_image("h/config", kind, img)
    msg = refused(daemon, f"{hostile.host}/h/config:{kind}")
    assert "manifest config.digest is not a valid digest" in msg
    _never_asked(hostile, bad)


@pytest.mark.parametrize("kind", BAD)
def test_bad_digest_in_an_index_entry(daemon: Daemon, hostile: Hostile, canary: Canary,
                                      kind: str) -> None:
    bad = bad_digests(canary.path)[kind]
    index = {"schemaVersion": 2, "mediaType": ib.OCI_INDEX, "manifests": [
        {"mediaType": ib.OCI_MANIFEST, "digest": bad, "size": 100,
         "platform": {"architecture": ib.host_arch(), "os": "linux"}}]}
    hostile.manifests[("h/index", kind)] = (ib.OCI_INDEX, json.dumps(index).encode())
    msg = refused(daemon, f"{hostile.host}/h/index:{kind}")
    assert "index manifests[0].digest is not a valid digest" in msg
    _never_asked(hostile, bad)


def test_bad_digest_in_a_pull_by_digest_reference(daemon: Daemon, hostile: Hostile,
                                                  canary: Canary) -> None:
    before = len(hostile.requests)
    msg = refused(daemon, f"{hostile.host}/h/bydigest@sha512:" + "A" * 128,
                  grpc.StatusCode.INVALID_ARGUMENT)
    assert "must be lowercase hex" in msg
    assert len(hostile.requests) == before  # it never became a URL


# --- the layer store trusts only its own markers ------------------------------------------

def test_planted_layer_dir_is_not_trusted(daemon: Daemon, registry: Registry,
                                          canary: Canary) -> None:
    img = ib.build_image([ib.busybox_layer_tar(), unique_layer("planted")])
    ib.push_image(registry.host, "hostile/planted", "v1", img)
    hexpart = img.diff_ids[1].partition(":")[2]
    planted = os.path.join(daemon.root, "images", "layers", hexpart)
    os.makedirs(planted)
    with open(os.path.join(planted, "planted"), "w") as fh:
        fh.write("not from the image\n")
    ref = f"{registry.host}/hostile/planted:v1"
    pull(daemon, ref)
    top = layer_dirs(daemon, ref)[1]
    assert top == planted
    assert os.listdir(top) == ["data"] and os.listdir(os.path.join(top, "data")) == ["planted"]


def test_planted_symlink_to_a_host_dir_is_replaced_not_followed(
        daemon: Daemon, registry: Registry, canary: Canary) -> None:
    img = ib.build_image([ib.busybox_layer_tar(), unique_layer("symlinked")])
    ib.push_image(registry.host, "hostile/symlinked", "v1", img)
    planted = os.path.join(daemon.root, "images", "layers", img.diff_ids[1].partition(":")[2])
    os.symlink(canary.path, planted)
    ref = f"{registry.host}/hostile/symlinked:v1"
    pull(daemon, ref)
    assert not os.path.islink(planted)
    assert os.listdir(os.path.join(planted, "data")) == ["symlinked"]


def test_unmarked_layer_dirs_are_removed_at_start(daemon: Daemon, canary: Canary) -> None:
    layers = os.path.join(daemon.root, "images", "layers")
    stray = os.path.join(layers, "e" * 64)
    os.makedirs(os.path.join(stray, "etc"))
    link = os.path.join(layers, "f" * 64)
    os.symlink(canary.path, link)
    daemon.stop()
    daemon.start()
    assert not os.path.lexists(stray) and not os.path.lexists(link)


def test_store_dirs_are_private(daemon: Daemon, busybox_ref: str) -> None:
    pull(daemon, busybox_ref)
    images = os.path.join(daemon.root, "images")
    for d in ("", "blobs", "blobs/sha256", "layers", "tmp", "verified"):
        assert stat.S_IMODE(os.stat(os.path.join(images, d)).st_mode) == 0o700, d
    # The layer tree itself keeps the image's modes (overlay lower dirs).
    [base] = layer_dirs(daemon, busybox_ref)
    assert stat.S_IMODE(os.stat(os.path.join(base, "tmp")).st_mode) == 0o1777


# --- what a layer's tar says --------------------------------------------------------------

def tar_cases(canary: str) -> dict[str, tuple[list[ib.Entry], str | None]]:
    """name -> (entries, expected refusal text or None when the pull succeeds)."""
    return {
        "dotdot-name": ([ib.file("../../../../../.." + canary + "/dotdot", "x")],
                        "'..' component"),
        "dotdot-inside": ([ib.file("data/../../escape", "x")], "'..' component"),
        "absolute-name": ([ib.file(canary + "/absolute", "x")], None),
        "symlink-then-write": ([ib.symlink("esc", canary), ib.file("esc/pwned", "x")],
                               "goes through a symlink"),
        "symlink-dir-then-write": ([ib.symlink("esc2", canary + "/sub"),
                                    ib.file("esc2/nested", "overwritten")],
                                   "goes through a symlink"),
        "hardlink-absolute": ([ib.hardlink("h", canary + "/secret")],
                              "does not exist in the layer"),
        "hardlink-dotdot": ([ib.hardlink("h", "../../../../../.." + canary + "/secret")],
                            "'..' component"),
        "hardlink-through-symlink": ([ib.symlink("esc3", canary),
                                      ib.hardlink("h", "esc3/secret")],
                                     "goes through a symlink"),
        "device-nodes": ([ib.directory("dev"), ib.chardev("dev/mem", 1, 1),
                          ib.Entry("dev/sda", b"4", b"", 0o660, devmajor=8, devminor=0)],
                         None),
        "whiteout-dotdot": ([ib.file(".wh...", "")], "bad whiteout"),
        "whiteout-dot": ([ib.file("data/.wh..", "")], "bad whiteout"),
        "whiteout-escaping": ([ib.file("data/.wh.../..", "")], "'..' component"),
        "whiteout-through-symlink": ([ib.symlink("esc4", canary), ib.file("esc4/.wh.secret", "")],
                                     "goes through a symlink"),
        "opaque-through-symlink": ([ib.symlink("esc5", canary), ib.opaque("esc5")],
                                   "goes through a symlink"),
    }


TAR_CASES = list(tar_cases("/x"))


@pytest.mark.parametrize("case", TAR_CASES)
def test_layer_tar_cannot_reach_the_host(daemon: Daemon, registry: Registry, canary: Canary,
                                         case: str) -> None:
    entries, refusal = tar_cases(canary.path)[case]
    img = ib.build_image([ib.busybox_layer_tar(), [*unique_layer(case), *entries]])
    ib.push_image(registry.host, "hostile/tar", case, img)
    ref = f"{registry.host}/hostile/tar:{case}"
    if refusal is None:
        pull(daemon, ref)
        top = layer_dirs(daemon, ref)[1]
        # What the tar named lands inside the layer, below the private store.
        assert os.path.realpath(top).startswith(os.path.join(daemon.root, "images") + "/")
        if case == "absolute-name":
            assert os.path.isfile(os.path.join(top, canary.path.lstrip("/"), "absolute"))
        if case == "device-nodes":
            assert stat.S_ISCHR(os.lstat(os.path.join(top, "dev", "mem")).st_mode)
            assert stat.S_ISBLK(os.lstat(os.path.join(top, "dev", "sda")).st_mode)
        return
    msg = refused(daemon, ref)
    assert f"hostile/tar:{case}" in msg and "refused" in msg, msg
    assert refusal in msg, msg


# --- decompression ------------------------------------------------------------------------

@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_decompression_bomb_stops_at_the_limit(daemon: Daemon, registry: Registry,
                                               canary: Canary, compression: str) -> None:
    bomb = ib.make_tar([ib.file("zeros", b"\0" * (2 * MAX_LAYER))])
    img = ib.build_image([ib.busybox_layer_tar(), bomb],
                         layer_compressions=["gzip", compression])
    assert len(img.layers[1].data) < MAX_LAYER // 100  # a real bomb: tiny on the wire
    ib.push_image(registry.host, "hostile/bomb", compression, img)
    msg = refused(daemon, f"{registry.host}/hostile/bomb:{compression}")
    assert f"hostile/bomb:{compression}" in msg and img.layers[1].digest in msg
    assert f"limit of {MAX_LAYER} bytes" in msg
    assert "registry.max_layer_uncompressed_size" in msg


def test_layer_under_the_limit_pulls(daemon: Daemon, registry: Registry,
                                     canary: Canary) -> None:
    img = ib.build_image([ib.busybox_layer_tar(),
                          ib.make_tar([ib.file("zeros", b"\0" * (MAX_LAYER // 2))])])
    ib.push_image(registry.host, "hostile/bomb", "small", img)
    pull(daemon, f"{registry.host}/hostile/bomb:small")


def test_a_store_from_before_markers_keeps_its_recorded_layers_only(
        daemon: Daemon, busybox_ref: str, canary: Canary) -> None:
    pull(daemon, busybox_ref)
    [base] = layer_dirs(daemon, busybox_ref)
    images = os.path.join(daemon.root, "images")
    stray = os.path.join(images, "layers", "d" * 64)  # named like a layer, in no record
    daemon.stop()
    shutil.rmtree(os.path.join(images, "verified"))
    os.makedirs(os.path.join(stray, "bin"))
    daemon.start()
    assert layer_dirs(daemon, busybox_ref) == [base]
    assert os.path.isfile(os.path.join(base, "bin", "busybox"))
    assert os.path.basename(base) in os.listdir(os.path.join(images, "verified"))
    assert not os.path.lexists(stray)
