"""What the registry client (crishim/image/client.py) accepts from a registry, which is
untrusted: a manifest or blob must match its digest (by digest, and by tag against the
registry's own Docker-Content-Digest), bodies are bounded, and a transient 5xx is retried.
The registry is an httpx mock transport."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import httpx
import pytest

from crishim.config import RegistryConfig
from crishim.errors import FailedPrecondition
from crishim.image import client as client_mod
from crishim.image import reference
from crishim.image.client import BlobMismatch, ClientPool, RegistrySession, verify
from crishim.image.hosts import Endpoint
from crishim.image.progress import ProgressFeed

MANIFEST = json.dumps({"schemaVersion": 2, "mediaType":
                       "application/vnd.oci.image.manifest.v1+json"}).encode()
BLOB = b"config bytes"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


Handler = Callable[[httpx.Request], httpx.Response]


class MockPool(ClientPool):
    def __init__(self, handler: Handler) -> None:
        super().__init__(10.0)
        self.client = httpx.AsyncClient(transport=httpx.MockTransport(handler))

    def get(self, ep: Endpoint) -> httpx.AsyncClient:
        return self.client

    async def close(self) -> None:
        await self.client.aclose()


async def session(handler: Handler, tmp: str) -> tuple[RegistrySession, MockPool]:
    pool = MockPool(handler)
    s = RegistrySession(RegistryConfig(config_path=tmp), reference.parse("registry.test/app:v1"),
                        None, pool, ProgressFeed())
    return s, pool


def registry(manifest: bytes = MANIFEST, header: str | None = None, blob: bytes = BLOB,
             fail_first: int = 0) -> tuple[Handler, list[str]]:
    seen: list[str] = []

    def handle(req: httpx.Request) -> httpx.Response:
        seen.append(req.url.path)
        if len(seen) <= fail_first:
            return httpx.Response(503)
        if "/manifests/" in req.url.path:
            headers = {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}
            headers["Docker-Content-Digest"] = sha(manifest) if header is None else header
            return httpx.Response(200, headers=headers, stream=httpx.ByteStream(manifest))
        if "/blobs/" in req.url.path:
            return httpx.Response(200, stream=httpx.ByteStream(blob))
        return httpx.Response(404)
    return handle, seen


def test_verify_refuses_other_content_and_unknown_algorithms() -> None:
    verify(BLOB, sha(BLOB), "blob")
    with pytest.raises(BlobMismatch, match="does not match"):
        verify(BLOB + b"x", sha(BLOB), "blob")
    with pytest.raises(BlobMismatch, match="unsupported digest algorithm 'md5'"):
        verify(BLOB, "md5:" + hashlib.md5(BLOB).hexdigest(), "blob")


async def test_a_manifest_by_tag_is_checked_against_the_registrys_digest(
        tmp_path: object) -> None:
    handler, _ = registry()
    s, pool = await session(handler, str(tmp_path))
    try:
        m = await s.manifest("v1")
        assert m.digest == sha(MANIFEST) and m.body == MANIFEST
        assert m.media_type == "application/vnd.oci.image.manifest.v1+json"
    finally:
        await pool.close()
    handler, _ = registry(header=sha(b"something else"))
    s, pool = await session(handler, str(tmp_path))
    try:
        with pytest.raises(BlobMismatch, match="Docker-Content-Digest"):
            await s.manifest("v1")
    finally:
        await pool.close()


async def test_a_manifest_by_digest_must_have_that_digest(tmp_path: object) -> None:
    handler, _ = registry(manifest=MANIFEST + b" ")
    s, pool = await session(handler, str(tmp_path))
    try:
        with pytest.raises(BlobMismatch, match="does not match"):
            await s.manifest(sha(MANIFEST))
    finally:
        await pool.close()


async def test_a_blob_must_match_and_fit(tmp_path: object) -> None:
    handler, _ = registry(blob=b"tampered")
    s, pool = await session(handler, str(tmp_path))
    try:
        with pytest.raises(BlobMismatch):
            await s.blob_bytes(sha(BLOB))
    finally:
        await pool.close()
    big = b"x" * 2048
    handler, _ = registry(blob=big)
    s, pool = await session(handler, str(tmp_path))
    try:
        with pytest.raises(FailedPrecondition, match="larger than 1024 bytes"):
            await s.blob_bytes(sha(big), limit=1024)
    finally:
        await pool.close()


async def test_a_transient_server_error_is_retried(tmp_path: object,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_mod, "BACKOFF", [0.0] * 10)
    handler, seen = registry(fail_first=1)
    s, pool = await session(handler, str(tmp_path))
    try:
        assert await s.blob_bytes(sha(BLOB)) == BLOB
    finally:
        await pool.close()
    assert len(seen) == 2, seen
