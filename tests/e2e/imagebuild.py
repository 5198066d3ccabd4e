"""Build OCI/Docker images in Python (no docker daemon) and push them to a registry.

    digest = push_busybox(reg.host, "test/busybox", "latest")
    img = build_busybox(...); push_image(reg.host, "test/x", "v1", img); img.image_id

The base layer is /usr/bin/busybox (static) at /bin/busybox with a symlink per applet,
/etc/passwd + /etc/group (root, nobody, app uid/gid 1000) and /tmp (1777). Builds are
deterministic (fixed mtimes, gzip mtime 0): the same inputs give the same digests.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import platform
import random
import subprocess
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

import httpx

BUSYBOX = "/usr/bin/busybox"
MTIME = 1_700_000_000
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Media = Literal["oci", "docker"]
Compression = Literal["gzip", "zstd", "none"]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER_TYPES = {
    ("oci", "gzip"): "application/vnd.oci.image.layer.v1.tar+gzip",
    ("oci", "zstd"): "application/vnd.oci.image.layer.v1.tar+zstd",
    ("oci", "none"): "application/vnd.oci.image.layer.v1.tar",
    ("docker", "gzip"): "application/vnd.docker.image.rootfs.diff.tar.gzip",
    # Docker has no zstd/plain type of its own; registries and runtimes accept the OCI ones.
    ("docker", "zstd"): "application/vnd.oci.image.layer.v1.tar+zstd",
    ("docker", "none"): "application/vnd.oci.image.layer.v1.tar",
}


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def host_arch() -> str:
    m = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(m, m)


# --- tar entries -------------------------------------------------------------------------

@dataclass
class Entry:
    """One tar member. Use the helpers below (file, directory, symlink, ...)."""

    name: str
    type: bytes = tarfile.REGTYPE
    data: bytes = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    linkname: str = ""
    devmajor: int = 0
    devminor: int = 0
    xattrs: dict[str, str] = field(default_factory=dict)
    mtime: int = MTIME

    def tarinfo(self) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(self.name)
        ti.type = self.type
        ti.mode = self.mode
        ti.uid, ti.gid = self.uid, self.gid
        ti.uname = ti.gname = ""
        ti.mtime = self.mtime
        ti.linkname = self.linkname
        ti.devmajor, ti.devminor = self.devmajor, self.devminor
        ti.size = len(self.data) if self.type == tarfile.REGTYPE else 0
        if self.xattrs:
            ti.pax_headers = {"SCHILY.xattr." + k: v for k, v in self.xattrs.items()}
        return ti


def file(name: str, data: bytes | str, mode: int = 0o644, uid: int = 0, gid: int = 0,
         **kw: Any) -> Entry:
    raw = data.encode() if isinstance(data, str) else data
    return Entry(name, tarfile.REGTYPE, raw, mode, uid, gid, **kw)


def directory(name: str, mode: int = 0o755, uid: int = 0, gid: int = 0, **kw: Any) -> Entry:
    return Entry(name, tarfile.DIRTYPE, b"", mode, uid, gid, **kw)


def symlink(name: str, target: str, **kw: Any) -> Entry:
    return Entry(name, tarfile.SYMTYPE, b"", 0o777, linkname=target, **kw)


def hardlink(name: str, target: str, **kw: Any) -> Entry:
    return Entry(name, tarfile.LNKTYPE, b"", 0o644, linkname=target, **kw)


def chardev(name: str, major: int, minor: int, mode: int = 0o666) -> Entry:
    return Entry(name, tarfile.CHRTYPE, b"", mode, devmajor=major, devminor=minor)


def fifo(name: str, mode: int = 0o644) -> Entry:
    return Entry(name, tarfile.FIFOTYPE, b"", mode)


def whiteout(path: str) -> Entry:
    """Delete `path` of a lower layer (OCI whiteout file .wh.<name>)."""
    d, _, base = path.strip("/").rpartition("/")
    return file((d + "/" if d else "") + ".wh." + base, b"")


def opaque(dirpath: str) -> Entry:
    """Hide everything lower layers put in `dirpath` (OCI opaque whiteout)."""
    return file(dirpath.strip("/") + "/.wh..wh..opq", b"")


def make_tar(entries: Iterable[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            tf.addfile(e.tarinfo(), io.BytesIO(e.data) if e.type == tarfile.REGTYPE else None)
    return buf.getvalue()


@cache
def busybox_applets() -> tuple[str, ...]:
    out = subprocess.run([BUSYBOX, "--list"], check=True, capture_output=True, text=True)
    return tuple(a for a in out.stdout.split() if a and "/" not in a and a != "busybox")


PASSWD = ("root:x:0:0:root:/root:/bin/sh\n"
          "app:x:1000:1000:app:/home/app:/bin/sh\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
GROUP = "root:x:0:\napp:x:1000:\nnogroup:x:65534:\nnobody:x:65534:\n"


@cache
def busybox_layer_tar(hardlinks: bool = False) -> bytes:
    """The base layer; `hardlinks` makes each applet a hard link of /bin/busybox (as in
    the upstream busybox image) instead of a symlink."""
    with open(BUSYBOX, "rb") as fh:
        binary = fh.read()
    entries = [directory("bin"), file("bin/busybox", binary, 0o755)]
    entries += [hardlink("bin/" + a, "bin/busybox") if hardlinks else symlink("bin/" + a, "busybox")
                for a in busybox_applets()]
    entries += [directory("etc"), file("etc/passwd", PASSWD), file("etc/group", GROUP),
                directory("tmp", 0o1777), directory("root", 0o700),
                directory("home"), directory("home/app", 0o755, 1000, 1000),
                directory("usr"), directory("usr/bin"), directory("sbin"),
                directory("usr/sbin"), directory("var"), directory("proc"),
                directory("sys"), directory("dev")]
    return make_tar(entries)


# --- image assembly ----------------------------------------------------------------------

def compress(data: bytes, compression: Compression, level: int = 6) -> bytes:
    if compression == "gzip":
        return gzip.compress(data, compresslevel=level, mtime=0)
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(data)
    return data


@dataclass
class Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return sha256(self.data)

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data),
                **extra}


@dataclass
class BuiltImage:
    """A single-platform image ready to push; `image_id` is what PullImage returns."""

    config: Blob
    layers: list[Blob]
    manifest: Blob
    diff_ids: list[str]
    config_json: dict[str, Any]

    @property
    def manifest_digest(self) -> str:
        return self.manifest.digest

    @property
    def image_id(self) -> str:
        return self.config.digest

    @property
    def size(self) -> int:
        return len(self.config.data) + sum(len(b.data) for b in self.layers)


LayerSpec = bytes | Sequence[Entry]
"""An uncompressed tar (bytes) or a list of entries."""


def build_image(layers: Sequence[LayerSpec], *, config_overrides: Mapping[str, Any] | None = None,
                media: Media = "oci", compression: Compression = "gzip",
                layer_compressions: Sequence[Compression] | None = None,
                arch: str | None = None, variant: str = "",
                layer_media_types: Sequence[str | None] | None = None,
                gzip_level: int = 6) -> BuiltImage:
    tars = [spec if isinstance(spec, bytes) else make_tar(spec) for spec in layers]
    comps = list(layer_compressions or [compression] * len(tars))
    blobs = []
    for i, (tar, comp) in enumerate(zip(tars, comps, strict=True)):
        mt = LAYER_TYPES[(media, comp)]
        if layer_media_types and layer_media_types[i]:
            mt = layer_media_types[i]  # type: ignore[assignment]
        blobs.append(Blob(mt, compress(tar, comp, gzip_level)))
    diff_ids = [sha256(t) for t in tars]
    cfg: dict[str, Any] = {"Env": [PATH_ENV], "Cmd": ["sh"]}
    cfg.update(config_overrides or {})
    config_json: dict[str, Any] = {
        "created": "2023-11-14T22:13:20Z",
        "architecture": arch or host_arch(),
        "os": "linux",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": "2023-11-14T22:13:20Z", "created_by": f"crishim test layer {i}"}
                    for i in range(len(tars))],
    }
    if variant:
        config_json["variant"] = variant
    config = Blob(OCI_CONFIG if media == "oci" else DOCKER_CONFIG,
                  json.dumps(config_json, sort_keys=True).encode())
    mtype = OCI_MANIFEST if media == "oci" else DOCKER_MANIFEST
    manifest_json = {"schemaVersion": 2, "mediaType": mtype,
                     "config": config.descriptor(),
                     "layers": [b.descriptor() for b in blobs]}
    manifest = Blob(mtype, json.dumps(manifest_json, indent=2).encode())
    return BuiltImage(config, blobs, manifest, diff_ids, config_json)


def build_busybox(*, extra_layers: Sequence[LayerSpec] = (),
                  config_overrides: Mapping[str, Any] | None = None, media: Media = "oci",
                  compression: Compression = "gzip", gzip_level: int = 6) -> BuiltImage:
    return build_image([busybox_layer_tar(), *extra_layers], config_overrides=config_overrides,
                       media=media, compression=compression, gzip_level=gzip_level)


# --- pushing (distribution HTTP API) -----------------------------------------------------

def _client(auth: tuple[str, str] | None) -> httpx.Client:
    # verify=False: test registries with TLS use a throwaway self-signed certificate.
    return httpx.Client(auth=auth, timeout=120.0, verify=False)


def _url(host: str) -> str:
    """`host` is "127.0.0.1:5000" (plain HTTP) or a full "https://127.0.0.1:5000"."""
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


def push_blob(client: httpx.Client, host: str, repo: str, blob: Blob) -> None:
    base = f"{_url(host)}/v2/{repo}/blobs/"
    if client.head(base + blob.digest).status_code == 200:
        return
    r = client.post(base + "uploads/")
    r.raise_for_status()
    loc = r.headers["Location"]
    if loc.startswith("/"):
        loc = f"{_url(host)}{loc}"
    sep = "&" if "?" in loc else "?"
    r = client.put(f"{loc}{sep}digest={blob.digest}", content=blob.data,
                   headers={"Content-Type": "application/octet-stream"})
    r.raise_for_status()


def push_manifest(client: httpx.Client, host: str, repo: str, ref: str, blob: Blob) -> str:
    r = client.put(f"{_url(host)}/v2/{repo}/manifests/{ref}", content=blob.data,
                   headers={"Content-Type": blob.media_type})
    if r.status_code >= 300:
        raise RuntimeError(f"push manifest {repo}:{ref}: {r.status_code} {r.text}")
    return blob.digest


def push_image(host: str, repo: str, tag: str, image: BuiltImage, *,
               auth: tuple[str, str] | None = None) -> str:
    """Push blobs + manifest; returns the manifest digest. Non-distributable layers (those
    with "urls") are not uploaded, as a registry expects."""
    with _client(auth) as c:
        for blob in (image.config, *image.layers):
            if "nondistributable" in blob.media_type or "foreign" in blob.media_type:
                continue
            push_blob(c, host, repo, blob)
        return push_manifest(c, host, repo, tag, image.manifest)


def push_busybox(registry_host: str, repo: str = "test/busybox", tag: str = "latest", *,
                 extra_layers: Sequence[LayerSpec] = (),
                 config_overrides: Mapping[str, Any] | None = None, media: Media = "oci",
                 compression: Compression = "gzip",
                 auth: tuple[str, str] | None = None) -> str:
    """Build the busybox image (+ extra layers) and push it; returns the manifest digest."""
    img = build_busybox(extra_layers=extra_layers, config_overrides=config_overrides,
                        media=media, compression=compression)
    return push_image(registry_host, repo, tag, img, auth=auth)


# --- special images ----------------------------------------------------------------------

def whiteout_layers() -> list[LayerSpec]:
    """Two layers on top of busybox. Result in the container:
    /data/keep = "keep", /data/gone absent, /data/sub absent (whited-out dir),
    /opq holds only "c" (opaque), /data/link -> keep, /data/hard is a hardlink of keep,
    /etc/app.conf mode 0640 owned 1000:1000."""
    layer2 = [directory("data"), file("data/keep", "keep"), hardlink("data/hard", "data/keep"),
              file("data/gone", "gone"),
              directory("data/sub"), file("data/sub/x", "x"),
              directory("opq"), file("opq/a", "a"), file("opq/b", "b")]
    layer3 = [directory("data"), whiteout("data/gone"), whiteout("data/sub"),
              symlink("data/link", "keep"),
              directory("opq"), opaque("opq"), file("opq/c", "c"),
              file("etc/app.conf", "conf", 0o640, 1000, 1000)]
    return [layer2, layer3]


def push_whiteout_image(host: str, repo: str = "test/whiteout", tag: str = "latest", *,
                        media: Media = "oci", auth: tuple[str, str] | None = None) -> BuiltImage:
    img = build_busybox(extra_layers=whiteout_layers(), media=media)
    push_image(host, repo, tag, img, auth=auth)
    return img


@dataclass
class MultiArch:
    index_digest: str
    index: Blob
    images: dict[str, BuiltImage]  # "linux/amd64", "linux/arm64", "linux/arm/v7"

    @property
    def host_image(self) -> BuiltImage:
        return self.images["linux/" + host_arch()]


def push_multiarch(host: str, repo: str = "test/multiarch", tag: str = "latest", *,
                   media: Media = "oci", auth: tuple[str, str] | None = None) -> MultiArch:
    """An index with linux/amd64, linux/arm64 and linux/arm/v7. Only the host arch is the
    real busybox image; the others hold /ARCH with their platform name (never runnable)."""
    platforms = [("amd64", ""), ("arm64", ""), ("arm", "v7")]
    images: dict[str, BuiltImage] = {}
    for arch, variant in platforms:
        name = "linux/" + arch + ("/" + variant if variant else "")
        if arch == host_arch():
            img = build_busybox(media=media, extra_layers=[[file("ARCH", name)]])
        else:
            img = build_image([[file("ARCH", name)]], media=media, arch=arch, variant=variant)
        images[name] = img
    with _client(auth) as c:
        for img in images.values():
            for blob in (img.config, *img.layers):
                push_blob(c, host, repo, blob)
            push_manifest(c, host, repo, img.manifest_digest, img.manifest)
        entries = []
        for (arch, variant), img in zip(platforms, images.values(), strict=True):
            plat: dict[str, str] = {"architecture": arch, "os": "linux"}
            if variant:
                plat["variant"] = variant
            entries.append(img.manifest.descriptor(platform=plat))
        itype = OCI_INDEX if media == "oci" else DOCKER_LIST
        index = Blob(itype, json.dumps({"schemaVersion": 2, "mediaType": itype,
                                        "manifests": entries}, indent=2).encode())
        digest = push_manifest(c, host, repo, tag, index)
    return MultiArch(digest, index, images)


def big_layer_tar(size: int, seed: int, files: int = 64) -> bytes:
    """~`size` bytes over `files` files: half random bytes, half base64 text, so gzip has
    real work to do (like binaries + text of a real image)."""
    rnd = random.Random(seed)
    per = max(1, size // files)
    entries = [directory(f"big{seed}")]
    for i in range(files):
        raw = rnd.randbytes(per // 2)
        text = base64.b64encode(rnd.randbytes(per * 3 // 8))[: per - len(raw)]
        entries.append(file(f"big{seed}/f{i:04d}", raw + text))
    return make_tar(entries)


def build_big_image(*, layers: int = 5, total_mib: int = 120, seed: int = 0,
                    compression: Compression = "gzip", media: Media = "oci") -> BuiltImage:
    """Busybox + `layers` layers of data totalling ~total_mib MiB uncompressed (benchmark)."""
    per = total_mib * 1024 * 1024 // layers
    tars: list[LayerSpec] = [big_layer_tar(per, seed * 1000 + i) for i in range(layers)]
    # gzip level 1: building 120 MiB at level 6 takes ~20 s; pulls decompress just the same.
    return build_busybox(extra_layers=tars, compression=compression, media=media, gzip_level=1)


def push_big_image(host: str, repo: str = "bench/big", tag: str = "latest", *,
                   layers: int = 5, total_mib: int = 120, seed: int = 0,
                   compression: Compression = "gzip", media: Media = "oci",
                   auth: tuple[str, str] | None = None) -> BuiltImage:
    img = build_big_image(layers=layers, total_mib=total_mib, seed=seed,
                          compression=compression, media=media)
    push_image(host, repo, tag, img, auth=auth)
    return img


def ref(host: str, repo: str, tag: str = "latest") -> str:
    return f"{host}/{repo}:{tag}"

