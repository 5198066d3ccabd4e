"""Registries, token servers and blob CDNs faked: small HTTP servers on 127.0.0.1 recording
every request they receive."""

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

from tests.e2e.registry import self_signed

USER, PASSWORD, IDENTITY = "alice", "s3cret-pass", "identity-s3cret"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
GOOD_TOKEN = "tok-for-alice"  # issued only to an authenticated token request
ANON_TOKEN = "tok-anonymous"
MANIFEST = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"}'
BLOB = b"the blob's bytes"
BLOB_DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()


@dataclass
class Seen:
    """One request a Fake received."""

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
    """One HTTP/1.1 response on `w`."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    w.write(f"HTTP/1.1 {status} X\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()
            + body)
    await w.drain()


@dataclass
class World:
    """Fakes started in one test, their hosts.toml tree and the TLS they share."""

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
    """A World whose Fakes are closed at the end."""
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    self_signed(cert, key)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    w = World(tmp_path / "certs.d", cert, ctx, [], [])
    w.dir.mkdir()
    try:
        yield w
    finally:
        for f in w.fakes:
            await f.close()
