"""hosts.toml endpoints, auth challenges, AuthConfig decoding and platform selection."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import InvalidArgument
from crishim.image.auth import Credentials, parse_challenges
from crishim.image.hosts import endpoints, is_local
from crishim.image.platform import select


def test_default_endpoints(tmp_path: Path) -> None:
    [ep] = endpoints(str(tmp_path), "docker.io")
    assert ep.base == "https://registry-1.docker.io/v2" and not ep.http_fallback
    [ep] = endpoints(str(tmp_path), "127.0.0.1:5000")
    assert ep.base == "https://127.0.0.1:5000/v2"
    assert ep.http_fallback == "http://127.0.0.1:5000/v2"
    [ep] = endpoints(str(tmp_path), "quay.io")
    assert not ep.http_fallback


def test_hosts_toml_mirrors_in_order(tmp_path: Path) -> None:
    d = tmp_path / "registry.k8s.io"
    d.mkdir()
    (d / "hosts.toml").write_text('''
server = "https://registry.k8s.io"
[host."http://127.0.0.1:5001"]
  capabilities = ["pull"]
[host."https://mirror.example/prefix"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
  ca = ["/etc/ca.pem", "rel.pem"]
  [host."https://mirror.example/prefix".header]
    x-test = "1"
''')
    eps = endpoints(str(tmp_path), "registry.k8s.io")
    assert [e.base for e in eps] == ["http://127.0.0.1:5001/v2",
                                     "https://mirror.example/prefix/v2",
                                     "https://registry.k8s.io/v2"]
    assert eps[0].capabilities == ("pull",) and eps[0].is_mirror
    assert eps[1].skip_verify and eps[1].ca == ("/etc/ca.pem", str(d / "rel.pem"))
    assert eps[1].headers == {"x-test": "1"}
    assert not eps[2].is_mirror
    assert not any(e.send_credentials for e in eps)  # a mirror gets none unless told


def test_send_credentials_is_a_boolean(tmp_path: Path) -> None:
    d = tmp_path / "registry.k8s.io"
    d.mkdir()
    (d / "hosts.toml").write_text('[host."https://mirror.example"]\n  send_credentials = true\n')
    assert endpoints(str(tmp_path), "registry.k8s.io")[0].send_credentials
    (d / "hosts.toml").write_text('[host."https://mirror.example"]\n  send_credentials = "yes"\n')
    with pytest.raises(InvalidArgument, match="send_credentials of host"):
        endpoints(str(tmp_path), "registry.k8s.io")


def test_bad_hosts_toml(tmp_path: Path) -> None:
    (tmp_path / "_default").mkdir()
    (tmp_path / "_default" / "hosts.toml").write_text('[host."ftp://x"]\n')
    with pytest.raises(InvalidArgument, match="http"):
        endpoints(str(tmp_path), "example.com")


def test_is_local() -> None:
    assert is_local("localhost:5000") and is_local("127.0.0.1") and is_local("[::1]:5000")
    assert not is_local("example.com:5000") and not is_local("10.0.0.1")


def test_challenges() -> None:
    [c] = parse_challenges('Bearer realm="https://auth.example/token",service="reg",'
                           'scope="repository:a/b:pull"')
    assert c.scheme == "bearer"
    assert c.params == {"realm": "https://auth.example/token", "service": "reg",
                        "scope": "repository:a/b:pull"}
    assert [c.scheme for c in parse_challenges('Basic realm="x"')] == ["basic"]


def test_credentials_from_cri() -> None:
    assert Credentials.from_cri(None) is None
    assert Credentials.from_cri(pb.AuthConfig()) is None
    c = Credentials.from_cri(pb.AuthConfig(auth=base64.b64encode(b"alice:s3cr:t").decode()))
    assert c is not None and (c.username, c.password) == ("alice", "s3cr:t")
    assert "s3cr" not in repr(c) and "alice" not in repr(c)
    with pytest.raises(InvalidArgument) as exc:
        Credentials.from_cri(pb.AuthConfig(auth="!!notbase64"))
    assert "notbase64" not in str(exc.value)
    t = Credentials.from_cri(pb.AuthConfig(registry_token="tok"))
    assert t is not None and t.registry_token == "tok"
    assert t.host("registry.example:5000") == "registry.example:5000"
    s = Credentials.from_cri(pb.AuthConfig(username="a", password="b",
                                           server_address="https://index.docker.io/v1/"))
    assert s is not None and s.server_address == "docker.io" and s.host("quay.io") == "docker.io"


def entry(arch: str, variant: str = "", os: str = "linux") -> dict[str, object]:
    p = {"os": os, "architecture": arch}
    if variant:
        p["variant"] = variant
    return {"digest": f"{os}/{arch}/{variant}", "platform": p}


def test_platform_select() -> None:
    idx = [entry("amd64", os="windows"), entry("arm", "v7"), entry("amd64"), entry("arm64")]
    assert select(idx, ("linux", "amd64", ""))["digest"] == "linux/amd64/"  # type: ignore[index]
    assert select(idx, ("linux", "arm64", "v8"))["digest"] == "linux/arm64/"  # type: ignore[index]
    assert select(idx, ("linux", "arm", "v6")) is None  # a v6 host cannot run v7
    assert select([entry("arm", "v6"), entry("arm", "v7")],
                  ("linux", "arm", "v7"))["digest"] == "linux/arm/v7"  # type: ignore[index]
    assert select(idx, ("linux", "s390x", "")) is None
