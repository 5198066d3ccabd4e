"""Where a pull's registry credentials go: exactly which server received which
Authorization header (or secret in a token request's body).

Each case runs a real RegistrySession (httpx, hosts.toml) against small HTTP servers on
127.0.0.1 that record every request: registries, token servers and a blob CDN. Another
port is another host (as for containerd, the port is part of the host).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.config import RegistryConfig
from crishim.errors import InvalidArgument, Unauthenticated
from crishim.image import reference
from crishim.image.auth import Credentials, registry_host
from crishim.image.client import ClientPool, RegistrySession
from crishim.image.progress import ProgressFeed
from tests.e2e.registry import _self_signed

USER, PASSWORD, IDENTITY = "alice", "s3cret-pass", "identity-s3cret"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
GOOD_TOKEN = "tok-for-alice"  # issued only to an authenticated token request
ANON_TOKEN = "tok-anonymous"
MANIFEST = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"}'
BLOB = b"the blob's bytes"
BLOB_DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()


@dataclass
class Seen:
    server: str
    method: str
    path: str
    authorization: str
    body: bytes


class Fake:
    """A registry, token server or blob CDN on 127.0.0.1 (https with `tls`).

    auth: "" (open), "basic" (USER/PASSWORD) or "bearer" (GOOD_TOKEN, challenge naming
    `realm`). `/token` issues GOOD_TOKEN to Basic USER/PASSWORD or the IDENTITY refresh
    token, else ANON_TOKEN; `token_redirect` answers it with a 307 instead.
    `redirect_blobs` answers blob requests with a 307 to that base URL.
    """

    def __init__(self, name: str, log: list[Seen], tls: ssl.SSLContext | None = None) -> None:
        self.name, self.log, self.tls = name, log, tls
        self.auth = ""
        self.realm = ""
        self.redirect_blobs = ""
        self.token_redirect = ""
        self._server: asyncio.Server | None = None
        self._port = 0
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._port, "not started"
        return self._port

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0, ssl=self.tls)
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def seen(self) -> list[str]:
        """The Authorization header of each request this server received, in order."""
        return [s.authorization for s in self.log if s.server == self.name]

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while True:
                line = await reader.readline()
                if not line.startswith((b"GET ", b"HEAD ", b"POST ")):
                    return  # EOF, or a TLS hello on the plain port
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                method, target = line.decode().split()[:2]
                path = target.partition("?")[0]
                auth = headers.get("authorization", "")
                self.log.append(Seen(self.name, method, target, auth, body))
                await self._answer(writer, method, path, auth, body)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError,
                ssl.SSLError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _answer(self, w: asyncio.StreamWriter, method: str, path: str, auth: str,
                      body: bytes) -> None:
        if path == "/token":
            if self.token_redirect:
                return await send(w, 307, b"", {"Location": self.token_redirect})
            good = auth == BASIC or (method == "POST" and
                                     f"refresh_token={IDENTITY}".encode() in body)
            token = GOOD_TOKEN if good else ANON_TOKEN
            return await send(w, 200, f'{{"token": "{token}"}}'.encode(),
                              {"Content-Type": "application/json"})
        if self.auth == "basic" and auth != BASIC:
            return await send(w, 401, b"", {"WWW-Authenticate": 'Basic realm="fake"'})
        if self.auth == "bearer" and auth != "Bearer " + GOOD_TOKEN:
            return await send(w, 401, b"", {
                "WWW-Authenticate": f'Bearer realm="{self.realm}",service="fake"'})
        if re.fullmatch(r"(/mirror)?/v2/.+/manifests/[^/]+", path):
            return await send(w, 200, MANIFEST, {
                "Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        if path.endswith("/blobs/" + BLOB_DIGEST) or path.endswith("/cdn/" + BLOB_DIGEST):
            if self.redirect_blobs:
                return await send(w, 307, b"", {
                    "Location": f"{self.redirect_blobs}/cdn/{BLOB_DIGEST}"})
            return await send(w, 200, BLOB, {"Content-Type": "application/octet-stream"})
        await send(w, 404, b"{}", {"Content-Type": "application/json"})


async def send(w: asyncio.StreamWriter, status: int, body: bytes,
               headers: dict[str, str]) -> None:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    w.write(f"HTTP/1.1 {status} X\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()
            + body)
    await w.drain()


@dataclass
class World:
    dir: Path  # hosts.toml tree
    ca: str  # the TLS servers' certificate (its own CA)
    tls: ssl.SSLContext
    log: list[Seen]
    fakes: list[Fake]

    async def fake(self, name: str, *, tls: bool = False) -> Fake:
        f = Fake(name, self.log, self.tls if tls else None)
        await f.start()
        self.fakes.append(f)
        return f

    def hosts(self, host: str, text: str) -> None:
        (self.dir / host).mkdir(parents=True, exist_ok=True)
        (self.dir / host / "hosts.toml").write_text(text)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    _self_signed(cert, key)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    w = World(tmp_path / "certs.d", cert, ctx, [], [])
    w.dir.mkdir()
    try:
        yield w
    finally:
        for f in w.fakes:
            await f.close()


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
