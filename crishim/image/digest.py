"""OCI content digests (`algorithm:hex`), parsed once where they enter.

A digest read from a registry reply (manifest, index entry, config) or from a pull-by-digest
reference is untrusted text until it is parsed here: it becomes a URL, a blob file name and
a layer directory name, so only the parsed lowercase hex is ever used to build a path.

Accepted, as the OCI image spec registers them: sha256 (64 hex characters) and sha512 (128).
Any other algorithm that matches the spec's grammar is refused as unsupported; one that does
not match it is refused as malformed. Hex must be lowercase (the spec's encoded portion for
both algorithms is `[a-f0-9]`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from crishim.errors import FailedPrecondition

# Hex length of each supported algorithm's encoded portion.
ALGORITHMS = {"sha256": 64, "sha512": 128}

_ALGORITHM = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*")
_HEX = re.compile(r"[a-f0-9]+")


class BadDigest(ValueError):
    """Why a string is not a usable digest (the caller says whose and which field)."""


@dataclass(frozen=True)
class Digest:
    algorithm: str
    hex: str  # lowercase, exactly ALGORITHMS[algorithm] characters: safe as a file name

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"


def parse(value: object) -> Digest:
    """The digest `value` names; BadDigest saying why when it is not one we accept."""
    if not isinstance(value, str):
        raise BadDigest(f"expected a string, got {type(value).__name__}")
    shown = value if len(value) <= 160 else value[:160] + "..."
    algorithm, sep, hexpart = value.partition(":")
    if not sep:
        raise BadDigest(f"{shown!r} has no 'algorithm:' prefix")
    if not _ALGORITHM.fullmatch(algorithm):
        raise BadDigest(f"{shown!r} has a malformed algorithm {algorithm[:40]!r}")
    want = ALGORITHMS.get(algorithm)
    if want is None:
        raise BadDigest(f"{shown!r} uses unsupported algorithm {algorithm!r} "
                        f"(supported: {', '.join(ALGORITHMS)})")
    if not _HEX.fullmatch(hexpart):
        raise BadDigest(f"{shown!r}: the {algorithm} value must be lowercase hex "
                        "characters only")
    if len(hexpart) != want:
        raise BadDigest(f"{shown!r}: a {algorithm} value has {want} hex characters, "
                        f"this one has {len(hexpart)}")
    return Digest(algorithm, hexpart)


def checked(value: object, what: str) -> Digest:
    """parse(), refusing a bad one with FailedPrecondition that names `what` (the image
    and the field, e.g. "image X: config rootfs.diff_ids[1]")."""
    try:
        return parse(value)
    except BadDigest as exc:
        raise FailedPrecondition(f"{what} is not a valid digest: {exc}") from None


def is_valid(value: object) -> bool:
    try:
        parse(value)
    except BadDigest:
        return False
    return True
