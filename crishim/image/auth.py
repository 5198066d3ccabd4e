"""Registry credentials and the WWW-Authenticate challenge/token flow.

Credentials come from the CRI AuthConfig. They are never logged and never put into an
error message: `Credentials.__repr__` hides them, and errors only name the registry.
Where they may be sent (which endpoint, which token realm) is decided in client.py from
`Credentials.host` and the registry's hosts.toml.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument

# Docker Hub answers under several names; a server_address of any of them (the docker
# CLI's config uses https://index.docker.io/v1/) means the same registry.
_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")


def registry_host(address: str) -> str:
    """The host[:port] a registry name, endpoint or AuthConfig.server_address stands for:
    scheme and path dropped, lower case, the port kept (another port is another server),
    Docker Hub's names folded into "docker.io"."""
    text = address.strip()
    parts = urlsplit(text if "://" in text else "//" + text)
    host = parts.netloc.rpartition("@")[2].lower()
    if not host or any(c.isspace() for c in host):
        return ""
    return "docker.io" if host in _DOCKER_HUB else host


@dataclass(frozen=True)
class Credentials:
    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    registry_token: str = field(default="", repr=False)
    # registry_host() of AuthConfig.server_address; "" when the request named none.
    server_address: str = ""

    def __repr__(self) -> str:
        return "Credentials(<hidden>)"

    @property
    def has_basic(self) -> bool:
        return bool(self.username)

    def basic_header(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()

    @classmethod
    def from_cri(cls, auth: pb.AuthConfig | None) -> Credentials | None:
        if auth is None:
            return None
        username, password = auth.username, auth.password
        if auth.auth and not username:
            try:
                decoded = base64.b64decode(auth.auth, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise InvalidArgument("AuthConfig.auth is not base64 of user:password") from None
            username, sep, password = decoded.partition(":")
            if not sep:
                raise InvalidArgument("AuthConfig.auth must decode to user:password")
        if not (username or auth.identity_token or auth.registry_token):
            return None
        server = ""
        if auth.server_address:
            server = registry_host(auth.server_address)
            if not server:
                raise InvalidArgument(f"AuthConfig.server_address {auth.server_address!r} "
                                      "names no registry host")
        return cls(username, password, auth.identity_token, auth.registry_token, server)

    def host(self, registry: str) -> str:
        """The registry host these credentials are for, pulling from `registry`: the
        server_address when the request named one (as containerd's ParseAuth), else the
        registry the image names."""
        return self.server_address or registry_host(registry)


_PARAM = re.compile(r'([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


_CHALLENGE = re.compile(r'(?:^|(?<=[,\s]))([A-Za-z]+)\s+((?:[A-Za-z0-9_-]+\s*=\s*'
                        r'(?:"(?:[^"\\]|\\.)*"|[^\s,]*)\s*,?\s*)+)')


@dataclass
class Challenge:
    scheme: str  # "bearer" or "basic"
    params: dict[str, str]


def parse_challenges(header: str) -> list[Challenge]:
    """Parse a WWW-Authenticate header (one or more challenges)."""
    out: list[Challenge] = []
    # Split on scheme tokens: a word followed by a space and a key=.
    for m in _CHALLENGE.finditer(header):
        params = {k.lower(): (q if q else u).replace('\\"', '"')
                  for k, q, u in _PARAM.findall(m.group(2))}
        out.append(Challenge(m.group(1).lower(), params))
    if not out and header.strip():
        out.append(Challenge(header.strip().split()[0].lower(), {}))
    return out
