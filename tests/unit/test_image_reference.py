"""Image reference normalization, as docker/containerd do it."""

from __future__ import annotations

import pytest

from crishim.errors import InvalidArgument
from crishim.image.reference import parse

D = "sha256:" + "a" * 64


@pytest.mark.parametrize(("ref", "want"), [
    ("busybox", "docker.io/library/busybox:latest"),
    ("busybox:1.36", "docker.io/library/busybox:1.36"),
    ("library/busybox", "docker.io/library/busybox:latest"),
    ("docker.io/busybox", "docker.io/library/busybox:latest"),
    ("index.docker.io/library/busybox:1", "docker.io/library/busybox:1"),
    ("user/app", "docker.io/user/app:latest"),
    ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
    ("127.0.0.1:5000/test/busybox", "127.0.0.1:5000/test/busybox:latest"),
    ("localhost/app:v1", "localhost/app:v1"),
    ("localhost:5000/a/b/c:v1", "localhost:5000/a/b/c:v1"),
    (f"busybox@{D}", f"docker.io/library/busybox@{D}"),
    # tag + digest: the digest decides (containerd drops the tag)
    (f"quay.io/x/y:1.0@{D}", f"quay.io/x/y@{D}"),
    ("[::1]:5000/x:y", "[::1]:5000/x:y"),
])
def test_normalize(ref: str, want: str) -> None:
    assert str(parse(ref)) == want


@pytest.mark.parametrize(("ref", "why"), [
    ("", "empty"),
    ("Busybox", "lowercase"),
    ("busybox:", "bad tag"),
    ("busybox:-x", "bad tag"),
    ("busybox@sha256:abc", "bad digest"),
    ("busybox@sha256:" + "A" * 64, "64 lowercase"),
    ("busybox@md5", "bad digest"),
    ("a//b", "component"),
    ("bad host!/x", "whitespace"),
    ("x/-y", "component"),
    ("sha256:" + "b" * 64, "image ID"),
    ("b" * 64, "image ID"),
    ("registry:5000/x:" + "t" * 129, "bad tag"),
])
def test_invalid(ref: str, why: str) -> None:
    with pytest.raises(InvalidArgument, match=why):
        parse(ref)


def test_parts() -> None:
    r = parse("127.0.0.1:5000/test/busybox:v1")
    assert (r.domain, r.path, r.tag, r.object) == ("127.0.0.1:5000", "test/busybox", "v1", "v1")
    assert r.with_digest(D) == f"127.0.0.1:5000/test/busybox@{D}"
