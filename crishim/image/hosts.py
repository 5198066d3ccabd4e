"""Registry endpoints from a containerd-compatible hosts.toml tree.

    <config_path>/<host>/hosts.toml   (or <config_path>/_default/hosts.toml)
        server = "https://registry.example"
        [host."http://mirror.local:5000"]
          capabilities = ["pull", "resolve"]
          skip_verify = true
          ca = "/etc/certs/mirror.pem"          # or a list
          override_path = false
          send_credentials = false              # crishim's own key, see below
          [host."http://mirror.local:5000".header]
            x-custom = "1"

Mirrors are tried in file order, then the server. Without any configuration the server is
https://<host> (docker.io: registry-1.docker.io); localhost / 127.0.0.1 / ::1 also fall
back to plain HTTP, as containerd does for local registries.

A pull's credentials are for one registry host. They go to the server (the registry
itself, or the `server` this file names for it) and to a mirror on that same host; a
mirror on another host gets them only with `send_credentials = true`, since a mirror run
by someone else must not learn the registry's password (containerd sends them to every
host of the file; it ignores the key, so one file serves both).
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from crishim.errors import InvalidArgument
from crishim.log import get_logger

log = get_logger(__name__)

ALL_CAPS = ("pull", "resolve", "push")


@dataclass
class Endpoint:
    """One base URL to try (already ending in /v2), with its TLS settings."""

    base: str  # e.g. "https://registry-1.docker.io/v2"
    capabilities: tuple[str, ...] = ALL_CAPS
    skip_verify: bool = False
    ca: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    is_mirror: bool = False
    # For a local registry: https first, then this http base on connection/TLS failure.
    http_fallback: str = ""
    # A mirror on another host than the registry receives the pull's credentials only
    # when hosts.toml says so (send_credentials = true).
    send_credentials: bool = False

    @property
    def host(self) -> str:
        return urlsplit(self.base).netloc


def is_local(host: str) -> bool:
    name = host
    if name.startswith("["):
        name = name[1:name.index("]")] if "]" in name else name
    else:
        name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _default_server(host: str) -> str:
    return "https://registry-1.docker.io" if host == "docker.io" else f"https://{host}"


def _base(url: str, override_path: bool) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidArgument(f"hosts.toml: host {url!r} must be an http:// or https:// URL")
    path = parts.path.rstrip("/")
    if not override_path and not path.endswith("/v2"):
        path += "/v2"
    return f"{parts.scheme}://{parts.netloc}{path}"


def _paths(value: object, base_dir: str) -> tuple[str, ...]:
    """CA file paths; relative ones are relative to the hosts.toml directory (containerd)."""
    return tuple(p if os.path.isabs(p) else os.path.join(base_dir, p) for p in _as_tuple(value))


def _as_tuple(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return ()


def _flag(spec: dict[str, object], key: str, where: str) -> bool:
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise InvalidArgument(f"hosts.toml: {key} of host {where!r} must be true or false")
    return value


def hosts_file(config_path: str, host: str) -> str | None:
    if not config_path:
        return None
    # containerd's directory name for a host:port is "host:port"; also accept "_default".
    for name in (host, "_default"):
        path = os.path.join(config_path, name, "hosts.toml")
        if os.path.isfile(path):
            return path
    return None


def endpoints(config_path: str, host: str) -> list[Endpoint]:
    """Endpoints to try for registry `host`, in order."""
    path = hosts_file(config_path, host)
    data: dict[str, object] = {}
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise InvalidArgument(f"cannot read registry config {path}: "
                                  f"{(exc.strerror or 'read failed').lower()}") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgument(f"registry config {path} is not valid TOML: {exc}") from None
    base_dir = os.path.dirname(path) if path else ""
    result: list[Endpoint] = []
    hosts = data.get("host", {})
    if isinstance(hosts, dict):
        for url, spec in hosts.items():
            if not isinstance(spec, dict):
                continue
            caps = _as_tuple(spec.get("capabilities")) or ALL_CAPS
            headers = spec.get("header", {})
            result.append(Endpoint(
                base=_base(url, bool(spec.get("override_path", False))),
                capabilities=caps, skip_verify=bool(spec.get("skip_verify", False)),
                ca=_paths(spec.get("ca"), base_dir),
                headers={str(k): ", ".join(_as_tuple(v)) for k, v in headers.items()}
                if isinstance(headers, dict) else {},
                is_mirror=True, send_credentials=_flag(spec, "send_credentials", url)))
    server = data.get("server")
    if isinstance(server, str) and server:
        base = _base(server, False)
        ep = Endpoint(base=base, skip_verify=bool(data.get("skip_verify", False)),
                      ca=_paths(data.get("ca"), base_dir))
    else:
        ep = Endpoint(base=_base(_default_server(host), False))
        if is_local(host):
            ep.http_fallback = f"http://{host}/v2"
    result.append(ep)
    return result
