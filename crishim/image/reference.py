"""Image references, normalized the way docker/containerd do.

    parse("busybox")            -> docker.io/library/busybox:latest
    parse("host:5000/a/b@sha256:...")
A reference with both tag and digest keeps only the digest (the digest decides what is
pulled), as containerd's ParseDockerRef does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from crishim.errors import InvalidArgument

DEFAULT_DOMAIN = "docker.io"
LEGACY_DOMAIN = "index.docker.io"
OFFICIAL_PREFIX = "library/"
DEFAULT_TAG = "latest"

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_DOMAIN = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*"
    r"[a-zA-Z0-9])?))*(?::[0-9]+)?|\[[0-9a-fA-F:.]+\](?::[0-9]+)?")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}")
_SHA256 = re.compile(r"sha256:[a-f0-9]{64}")
HEX64 = re.compile(r"[a-f0-9]{64}")


@dataclass(frozen=True)
class Reference:
    domain: str
    path: str  # repository path below the domain, e.g. "library/busybox"
    tag: str = ""
    digest: str = ""

    @property
    def name(self) -> str:
        """Repository name with domain: docker.io/library/busybox."""
        return f"{self.domain}/{self.path}"

    def __str__(self) -> str:
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag}"

    @property
    def object(self) -> str:
        """What to ask the registry for: the digest if any, else the tag."""
        return self.digest or self.tag

    def with_digest(self, digest: str) -> str:
        return f"{self.name}@{digest}"


def split_domain(name: str) -> tuple[str, str]:
    first, sep, rest = name.partition("/")
    if not sep or ("." not in first and ":" not in first and first != "localhost"
                   and first == first.lower()):
        domain, path = DEFAULT_DOMAIN, name
    else:
        domain, path = first, rest
    if domain == LEGACY_DOMAIN:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = OFFICIAL_PREFIX + path
    return domain, path


def parse(ref: str) -> Reference:
    """Parse and normalize `ref`; InvalidArgument with the reason when it is not valid."""
    if not ref:
        raise InvalidArgument("image reference is empty")
    if len(ref) > 4096 or any(c.isspace() for c in ref):
        raise InvalidArgument(f"invalid image reference {ref!r}: contains whitespace or is "
                              "too long")
    if ref.startswith("sha256:") or HEX64.fullmatch(ref):
        raise InvalidArgument(f"invalid image reference {ref!r}: an image ID is not a "
                              "reference to pull (use repository[:tag|@digest])")
    rest, _, digest = ref.partition("@")
    if digest:
        if not _DIGEST.fullmatch(digest):
            raise InvalidArgument(f"invalid image reference {ref!r}: bad digest {digest!r}")
        if digest.startswith("sha256:") and not _SHA256.fullmatch(digest):
            raise InvalidArgument(f"invalid image reference {ref!r}: a sha256 digest has "
                                  "64 lowercase hex characters")
    # A tag is after the last ':' that comes after the last '/' (a ':' before is a port).
    tag = ""
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG.fullmatch(tag):
            raise InvalidArgument(f"invalid image reference {ref!r}: bad tag {tag!r}")
    if not rest:
        raise InvalidArgument(f"invalid image reference {ref!r}: no repository name")
    domain, path = split_domain(rest)
    if domain != DEFAULT_DOMAIN or rest.startswith(DEFAULT_DOMAIN + "/") \
            or rest.startswith(LEGACY_DOMAIN + "/"):
        if not _DOMAIN.fullmatch(domain):
            raise InvalidArgument(f"invalid image reference {ref!r}: bad registry host "
                                  f"{domain!r}")
    if path != path.lower():
        raise InvalidArgument(f"invalid image reference {ref!r}: repository name must be "
                              "lowercase")
    for comp in path.split("/"):
        if not _COMPONENT.fullmatch(comp):
            raise InvalidArgument(f"invalid image reference {ref!r}: bad repository path "
                                  f"component {comp!r}")
    if len(domain) + 1 + len(path) > 255:
        raise InvalidArgument(f"invalid image reference {ref!r}: repository name longer "
                              "than 255 characters")
    if digest:
        tag = ""  # the digest decides; containerd drops the tag as well
    elif not tag:
        tag = DEFAULT_TAG
    return Reference(domain, path, tag, digest)


def try_parse(ref: str) -> Reference | None:
    try:
        return parse(ref)
    except InvalidArgument:
        return None
