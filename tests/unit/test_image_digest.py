"""The OCI digest parser every registry-supplied digest goes through before any use."""

from __future__ import annotations

import pytest

from crishim.errors import FailedPrecondition
from crishim.image import digest

HEX64 = "0123456789abcdef" * 4
HEX128 = HEX64 * 2


def test_sha256_and_sha512_parse_to_their_hex() -> None:
    d = digest.parse("sha256:" + HEX64)
    assert (d.algorithm, d.hex, str(d)) == ("sha256", HEX64, "sha256:" + HEX64)
    assert digest.parse("sha512:" + HEX128).hex == HEX128


@pytest.mark.parametrize("value,why", [
    ("sha256:../../../../etc", "lowercase hex"),
    ("sha256:/etc", "lowercase hex"),
    ("sha256:" + HEX64[:-2] + "/x", "lowercase hex"),
    ("sha256:" + HEX64.upper(), "lowercase hex"),
    ("sha256:" + HEX64[:-1], "64 hex characters"),
    ("sha256:" + HEX64 + "0", "64 hex characters"),
    ("sha256:", "lowercase hex"),
    ("sha512:" + HEX64, "128 hex characters"),
    ("md5:" + HEX64[:32], "unsupported algorithm 'md5'"),
    ("sha256+b64u:" + HEX64, "unsupported algorithm"),
    ("SHA256:" + HEX64, "malformed algorithm"),
    ("sha256-:" + HEX64, "malformed algorithm"),
    (":" + HEX64, "malformed algorithm"),
    ("../x:" + HEX64, "malformed algorithm"),
    (HEX64, "no 'algorithm:' prefix"),
    ("sha256:" + HEX64 + "\n", "lowercase hex"),
    ("sha256:" + HEX64[:-1] + "\0", "lowercase hex"),
    ("", "no 'algorithm:' prefix"),
])
def test_refused_with_the_reason(value: str, why: str) -> None:
    with pytest.raises(digest.BadDigest) as info:
        digest.parse(value)
    assert why in str(info.value)
    assert not digest.is_valid(value)


@pytest.mark.parametrize("value", [None, 12, ["sha256:" + HEX64], {"a": 1}])
def test_not_a_string_is_refused(value: object) -> None:
    with pytest.raises(digest.BadDigest, match="expected a string"):
        digest.parse(value)


def test_checked_names_the_image_and_field() -> None:
    with pytest.raises(FailedPrecondition) as info:
        digest.checked("sha256:/var/lib/kubelet", "image r/x:1: config rootfs.diff_ids[1]")
    msg = str(info.value)
    assert msg.startswith("image r/x:1: config rootfs.diff_ids[1] is not a valid digest: ")
    assert "/var/lib/kubelet" in msg


def test_a_huge_value_is_shown_shortened() -> None:
    with pytest.raises(digest.BadDigest) as info:
        digest.parse("sha256:" + "a" * 100_000)
    assert len(str(info.value)) < 400
