"""Registry auth: htpasswd basic auth, the bearer token flow, registry tokens; credentials
never appear in errors or logs."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import grpc
import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from tests.e2e import imagebuild as ib
from tests.e2e.daemon import Daemon, running_daemon
from tests.e2e.registry import Registry, TokenProxy

USER, PASSWORD = "alice", "Pa55-w0rd-never-logged"


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon('[registry]\nconfig_path = "/nonexistent"\n') as d:
        yield d


@pytest.fixture(scope="module")
def auth_registry() -> Iterator[tuple[Registry, ib.BuiltImage]]:
    with Registry(users={USER: PASSWORD}) as reg:
        img = ib.build_busybox(extra_layers=[[ib.file("auth", "auth")]])
        ib.push_image(reg.host, "private/app", "v1", img, auth=(USER, PASSWORD))
        yield reg, img


def pull(d: Daemon, ref: str, auth: pb.AuthConfig | None = None) -> str:
    return str(d.images().PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref),
                                                        auth=auth), timeout=60).image_ref)


def assert_secret_not_leaked(d: Daemon, *texts: str) -> None:
    for text in (d.logs(), *texts):
        assert PASSWORD not in text
        assert base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode() not in text


def test_basic_auth(daemon: Daemon, auth_registry: tuple[Registry, ib.BuiltImage]) -> None:
    reg, img = auth_registry
    ref = f"{reg.host}/private/app:v1"
    with pytest.raises(grpc.RpcError) as exc:
        pull(daemon, ref)
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "no credentials" in (exc.value.details() or "")
    with pytest.raises(grpc.RpcError) as exc:
        pull(daemon, ref, pb.AuthConfig(username=USER, password="wrong-" + PASSWORD))
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    wrong = exc.value.details() or ""
    assert pull(daemon, ref, pb.AuthConfig(username=USER, password=PASSWORD)) == img.image_id
    daemon.images().RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)))
    encoded = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert pull(daemon, ref, pb.AuthConfig(auth=encoded)) == img.image_id
    assert_secret_not_leaked(daemon, wrong)


def test_token_flow(daemon: Daemon, auth_registry: tuple[Registry, ib.BuiltImage]) -> None:
    reg, img = auth_registry
    with TokenProxy(reg.host, token_users={USER: PASSWORD},
                    upstream_auth=(USER, PASSWORD)) as proxy:
        ref = f"{proxy.host}/private/app:v1"
        with pytest.raises(grpc.RpcError) as exc:
            pull(daemon, ref)
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as exc:
            pull(daemon, ref, pb.AuthConfig(username=USER, password="bad"))
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        proxy.requests.clear()
        assert pull(daemon, ref, pb.AuthConfig(username=USER, password=PASSWORD)) \
            == img.image_id
        assert any("scope=repository%3Aprivate%2Fapp%3Apull" in t or
                   "scope=repository:private/app:pull" in t for t in proxy.token_requests)
        # one challenge, then every registry request carried the bearer token
        assert [had for _m, _p, had in proxy.requests].count(False) == 1
        assert_secret_not_leaked(daemon, exc.value.details() or "")


def test_anonymous_token_and_registry_token(
        daemon: Daemon, auth_registry: tuple[Registry, ib.BuiltImage]) -> None:
    reg, img = auth_registry
    with TokenProxy(reg.host, anonymous=True, upstream_auth=(USER, PASSWORD)) as proxy:
        ref = f"{proxy.host}/private/app:v1"
        assert pull(daemon, ref) == img.image_id  # anonymous token, like Docker Hub
        assert proxy.token_requests
    with TokenProxy(reg.host, token_users={"nobody": "x"},
                    upstream_auth=(USER, PASSWORD)) as proxy:
        proxy.tokens.add("static-registry-token")
        ref = f"{proxy.host}/private/app:v1"
        daemon.images().RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)))
        assert pull(daemon, ref, pb.AuthConfig(registry_token="static-registry-token")) \
            == img.image_id
        assert not proxy.token_requests  # used as is, no token server round trip


def test_identity_token(daemon: Daemon, auth_registry: tuple[Registry, ib.BuiltImage]) -> None:
    reg, img = auth_registry
    with TokenProxy(reg.host, token_users={"nobody": "x"},
                    upstream_auth=(USER, PASSWORD)) as proxy:
        proxy.refresh_tokens.add("identity-" + PASSWORD)
        ref = f"{proxy.host}/private/app:v1"
        with pytest.raises(grpc.RpcError) as exc:
            pull(daemon, ref, pb.AuthConfig(identity_token="identity-wrong"))
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        daemon.images().RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)))
        assert pull(daemon, ref, pb.AuthConfig(identity_token="identity-" + PASSWORD)) \
            == img.image_id
        assert_secret_not_leaked(daemon, exc.value.details() or "")


def test_server_address(daemon: Daemon, auth_registry: tuple[Registry, ib.BuiltImage]) -> None:
    """Credentials for another registry (AuthConfig.server_address) are not sent: the pull
    goes on anonymously and the registry's refusal says why, as with containerd."""
    reg, img = auth_registry
    ref = f"{reg.host}/private/app:v1"
    port = int(reg.host.rpartition(":")[2])
    other = f"127.0.0.1:{port + 1}"
    with pytest.raises(grpc.RpcError) as exc:
        pull(daemon, ref, pb.AuthConfig(username=USER, password=PASSWORD,
                                        server_address=f"https://{other}"))
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    details = exc.value.details() or ""
    assert reg.host in details and other in details and "server_address" in details
    for address in (f"http://{reg.host}", reg.host, f"https://{reg.host}/v1/"):
        assert pull(daemon, ref, pb.AuthConfig(username=USER, password=PASSWORD,
                                               server_address=address)) == img.image_id
        daemon.images().RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)))
    assert_secret_not_leaked(daemon, details)
