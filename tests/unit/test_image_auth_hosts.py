"""Where a pull's registry credentials go: exactly which server received which
Authorization header (or secret in a token request's body).

Each case runs a real RegistrySession (httpx, hosts.toml) against small HTTP servers on
127.0.0.1 that record every request: registries, token servers and a blob CDN. Another
port is another host (as for containerd, the port is part of the host).
"""

from __future__ import annotations

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import RegistryConfig
from crishim.errors import InvalidArgument, Unauthenticated
from crishim.image import reference
from crishim.image.auth import Credentials, registry_host
from crishim.image.client import ClientPool, RegistrySession
from crishim.image.progress import ProgressFeed
from tests.fakes.registries import (
    BASIC,
    BLOB,
    BLOB_DIGEST,
    GOOD_TOKEN,
    IDENTITY,
    PASSWORD,
    USER,
    World,
)
from tests.fakes.registries import world as world  # the fixture


def creds(server_address: str = "", **kw: str) -> Credentials:
    auth = pb.AuthConfig(server_address=server_address, **kw) if kw else pb.AuthConfig(
        username=USER, password=PASSWORD, server_address=server_address)
    c = Credentials.from_cri(auth)
    assert c is not None
    return c


async def pull(w: World, image: str, c: Credentials | None) -> None:
    """Resolve the tag and fetch the blob, as a pull does."""
    pool = ClientPool(10.0)
    try:
        s = RegistrySession(RegistryConfig(config_path=str(w.dir)), reference.parse(image), c,
                            pool, ProgressFeed())
        await s.manifest("v1")
        assert await s.blob_bytes(BLOB_DIGEST) == BLOB
    finally:
        await pool.close()


# --- AuthConfig.server_address ----------------------------------------------------------------


def test_server_address_names_one_registry_host() -> None:
    for hub in ("docker.io", "https://index.docker.io/v1/", "registry-1.docker.io",
                "HTTPS://Registry-1.Docker.IO/v2/"):
        assert registry_host(hub) == "docker.io"
    assert registry_host("https://reg.example:5000/v1/") == "reg.example:5000"
    assert registry_host("reg.example") == "reg.example"
    assert registry_host("reg.example:443") != registry_host("reg.example")  # port counts
    assert registry_host("http://[::1]:5000") == "[::1]:5000"
    with pytest.raises(InvalidArgument, match="server_address"):
        Credentials.from_cri(pb.AuthConfig(username=USER, password=PASSWORD,
                                           server_address="https://"))


async def test_server_address_match_sends_credentials(world: World) -> None:
    reg = await world.fake("registry")
    reg.auth = "basic"
    for address in (reg.url, reg.host, reg.url + "/v1/"):
        world.log.clear()
        await pull(world, f"{reg.host}/t/app:v1", creds(address))
        assert set(reg.seen()) == {"", BASIC}  # the challenge, then the credentials


async def test_server_address_mismatch_keeps_credentials_and_says_so(world: World) -> None:
    reg = await world.fake("registry")
    reg.auth = "basic"
    other = f"127.0.0.1:{reg.port + 1}"  # the same machine, another registry
    with pytest.raises(Unauthenticated) as err:
        await pull(world, f"{reg.host}/t/app:v1", creds("https://" + other))
    assert reg.seen() == [""]  # asked once, anonymously; never given the password
    msg = str(err.value)
    assert reg.host in msg and other in msg and "server_address" in msg
    assert PASSWORD not in msg


async def test_docker_hub_names_are_one_registry(world: World) -> None:
    hub = await world.fake("hub")
    hub.auth = "basic"
    world.hosts("docker.io", f'server = "{hub.url}"\n')
    for address in ("https://index.docker.io/v1/", "registry-1.docker.io", "docker.io"):
        world.log.clear()
        await pull(world, "docker.io/library/app:v1", creds(address))
        assert BASIC in hub.seen()
    world.log.clear()
    with pytest.raises(Unauthenticated):
        await pull(world, "docker.io/library/app:v1", creds("quay.io"))
    assert BASIC not in hub.seen()


# --- mirrors ----------------------------------------------------------------------------------


async def test_mirror_on_another_host_gets_no_credentials(world: World) -> None:
    reg, mirror = await world.fake("registry"), await world.fake("mirror")
    reg.auth = mirror.auth = "basic"
    world.hosts("registry.test", f'server = "{reg.url}"\n'
                f'[host."{mirror.url}"]\n  capabilities = ["pull", "resolve"]\n')
    await pull(world, "registry.test/t/app:v1", creds())
    assert set(mirror.seen()) == {""}  # it asked, it was not answered
    assert BASIC in reg.seen()  # the registry's own server was, after the mirror failed


async def test_mirror_marked_send_credentials_gets_them(world: World) -> None:
    reg, mirror = await world.fake("registry"), await world.fake("mirror")
    reg.auth = mirror.auth = "basic"
    world.hosts("registry.test", f'server = "{reg.url}"\n'
                f'[host."{mirror.url}"]\n  capabilities = ["pull", "resolve"]\n'
                '  send_credentials = true\n')
    await pull(world, "registry.test/t/app:v1", creds())
    assert BASIC in mirror.seen() and reg.seen() == []


async def test_mirror_on_the_registry_host_gets_them(world: World) -> None:
    reg = await world.fake("registry")
    reg.auth = "basic"
    world.hosts(reg.host, f'server = "{reg.url}"\n'
                f'[host."{reg.url}/mirror"]\n  capabilities = ["pull", "resolve"]\n')
    await pull(world, f"{reg.host}/t/app:v1", creds())
    assert any(s.path.startswith("/mirror/v2/") and s.authorization == BASIC
               for s in world.log)


async def test_server_address_of_a_mirror_sends_only_to_that_mirror(world: World) -> None:
    reg, mirror = await world.fake("registry"), await world.fake("mirror")
    reg.auth = mirror.auth = "basic"
    world.hosts("registry.test", f'server = "{reg.url}"\n'
                f'[host."{mirror.url}"]\n  capabilities = ["pull", "resolve"]\n')
    await pull(world, "registry.test/t/app:v1", creds(mirror.url))
    assert BASIC in mirror.seen() and reg.seen() == []
    world.log.clear()
    await mirror.close()  # the mirror is gone: the registry still gets no credentials
    with pytest.raises(Unauthenticated, match="server_address"):
        await pull(world, "registry.test/t/app:v1", creds(mirror.url))
    assert reg.seen() == [""]


# --- token realms -----------------------------------------------------------------------------


async def test_https_realm_on_another_host_gets_credentials(world: World) -> None:
    """Docker Hub's case (registry-1.docker.io sends clients to auth.docker.io)."""
    reg, auth = await world.fake("registry"), await world.fake("auth", tls=True)
    reg.auth, reg.realm = "bearer", f"https://localhost:{auth.port}/token"
    world.hosts("registry.test", f'server = "{reg.url}"\nca = "{world.ca}"\n')
    await pull(world, "registry.test/t/app:v1", creds())
    assert auth.seen() == [BASIC]
    assert set(reg.seen()) == {"", "Bearer " + GOOD_TOKEN}


async def test_http_realm_gets_no_credentials_from_an_https_registry(world: World) -> None:
    reg, auth = await world.fake("registry", tls=True), await world.fake("auth")
    reg.auth, reg.realm = "bearer", auth.url + "/token"
    world.hosts("registry.test", f'server = "{reg.url}"\nca = "{world.ca}"\n')
    for c in (creds(), creds(identity_token=IDENTITY)):
        world.log.clear()
        with pytest.raises(Unauthenticated) as err:
            await pull(world, "registry.test/t/app:v1", c)
        assert auth.seen() == [""]  # an anonymous token was asked for, nothing more
        assert all(IDENTITY.encode() not in s.body for s in world.log)
        assert f"not sent to its token server {auth.host} over plain http" in str(err.value)


async def test_http_realm_beside_a_plain_http_local_registry_gets_them(world: World) -> None:
    """A local registry reached over plain http already gets the credentials in clear;
    its token server on the same machine may too (the e2e TokenProxy setup)."""
    reg, auth = await world.fake("registry"), await world.fake("auth")
    reg.auth, reg.realm = "bearer", auth.url + "/token"
    await pull(world, f"{reg.host}/t/app:v1", creds())
    assert auth.seen() == [BASIC]
    world.log.clear()
    await pull(world, f"{reg.host}/t/app:v1", creds(identity_token=IDENTITY))
    assert [s.method for s in world.log if s.server == "auth"] == ["POST"]


async def test_token_server_redirect_to_another_host_takes_no_secret(world: World) -> None:
    reg, auth, elsewhere = (await world.fake("registry"), await world.fake("auth"),
                            await world.fake("elsewhere"))
    reg.auth, reg.realm = "bearer", auth.url + "/token"
    auth.token_redirect = elsewhere.url + "/token"
    for c in (creds(), creds(identity_token=IDENTITY)):
        world.log.clear()
        with pytest.raises(Unauthenticated, match="redirected to another host"):
            await pull(world, f"{reg.host}/t/app:v1", c)
        assert elsewhere.seen() == []


# --- redirects --------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["basic", "bearer"])
async def test_blob_redirect_to_another_host_drops_authorization(world: World,
                                                                 scheme: str) -> None:
    reg, cdn, auth = (await world.fake("registry"), await world.fake("cdn"),
                      await world.fake("auth"))
    reg.auth, reg.realm, reg.redirect_blobs = scheme, auth.url + "/token", cdn.url
    await pull(world, f"{reg.host}/t/app:v1", creds())
    assert cdn.seen() == [""]  # the blob came from the CDN, without the registry's secret
    assert reg.seen()[-1] == (BASIC if scheme == "basic" else "Bearer " + GOOD_TOKEN)


async def test_redirect_target_asking_for_auth_is_not_answered(world: World) -> None:
    reg, cdn = await world.fake("registry"), await world.fake("cdn")
    reg.auth, reg.redirect_blobs = "basic", cdn.url
    cdn.auth = "basic"
    with pytest.raises(Unauthenticated, match=r"redirected .* credentials are not sent"):
        await pull(world, f"{reg.host}/t/app:v1", creds())
    assert set(cdn.seen()) == {""}


async def test_registry_token_goes_to_the_registry_only(world: World) -> None:
    reg, mirror = await world.fake("registry"), await world.fake("mirror")
    reg.auth = mirror.auth = "bearer"
    reg.realm = mirror.realm = reg.url + "/token"
    world.hosts("registry.test", f'server = "{reg.url}"\n'
                f'[host."{mirror.url}"]\n  capabilities = ["pull", "resolve"]\n')
    await pull(world, "registry.test/t/app:v1", creds(registry_token=GOOD_TOKEN))
    assert "Bearer " + GOOD_TOKEN not in mirror.seen()
    assert "Bearer " + GOOD_TOKEN in reg.seen()
