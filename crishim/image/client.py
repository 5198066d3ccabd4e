"""OCI distribution client (pull side): endpoints, auth, retries, digest-verified fetches.

One `RegistrySession` serves one pull of one repository. It walks the endpoints from
hosts.toml (mirrors first), answers auth challenges (basic, bearer token, identity and
registry tokens), retries 5xx / 429 / connection failures with backoff and verifies the
digest of every manifest and blob it returns. Blobs are streamed (`open_blob`); the
caller verifies their digest while consuming the stream.

Credentials go only where they belong (docs/configuration.md, "Where credentials go"):
to the host they are for (AuthConfig.server_address, else the image's registry), to its
configured server and to mirrors on that host or marked `send_credentials`; to a token
realm only over https (plain http only for a registry itself reached over plain http, on
its own machine); never along a redirect to another host.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from crishim.config import RegistryConfig
from crishim.errors import CrishimError, FailedPrecondition, NotFound, Unauthenticated, Unavailable
from crishim.image.auth import Challenge, Credentials, parse_challenges, registry_host
from crishim.image.hosts import Endpoint, endpoints, is_local
from crishim.image.progress import ProgressFeed, Transfer
from crishim.image.reference import Reference
from crishim.log import get_logger

log = get_logger(__name__)
# httpx/httpcore debug logs print every request line; keep them quiet so nothing about a
# registry conversation (tokens live in headers and token-server URLs) reaches the log.
logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpcore").setLevel(logging.WARNING)

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
MAX_MANIFEST = 8 * 1024 * 1024
MAX_CONFIG = 32 * 1024 * 1024
RETRIES = 4
BACKOFF = (0.1, 0.5, 1.0, 2.0)


class BlobMismatch(FailedPrecondition):
    """A blob or manifest's content does not match its digest (or size): the registry
    served other content than the image names (as containerd, FAILED_PRECONDITION)."""


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def verify(data: bytes, digest: str, what: str) -> None:
    algo, _, hexpart = digest.partition(":")
    if algo not in ("sha256", "sha512"):
        raise BlobMismatch(f"{what}: unsupported digest algorithm {algo!r}")
    got = hashlib.new(algo, data).hexdigest()
    if got != hexpart:
        raise BlobMismatch(f"{what}: content digest {algo}:{got} does not match {digest}")


class ClientPool:
    """httpx clients shared by all pulls, one per TLS setting (connection reuse).

    `read_timeout` bounds one wait for bytes on one connection (None: no bound). The pull
    watchdog (progress.py) is what ends a stalled pull, so this sits above its timeout:
    a connection that stalls while the rest of the pull progresses is still dropped and
    retried, and the two never race to report one stall.
    """

    CONNECT_TIMEOUT = 10.0
    TIMEOUT = 60.0  # writes and waits for a pooled connection

    def __init__(self, read_timeout: float | None) -> None:
        self._read_timeout = read_timeout
        self._clients: dict[tuple[bool, tuple[str, ...]], httpx.AsyncClient] = {}
        # Local registries that answered over plain HTTP (https failed): host -> http base.
        self.plain_http: dict[str, str] = {}

    def get(self, ep: Endpoint) -> httpx.AsyncClient:
        key = (ep.skip_verify, ep.ca)
        client = self._clients.get(key)
        if client is None:
            verify_arg: bool | ssl.SSLContext = True
            if ep.skip_verify:
                verify_arg = False
            elif ep.ca:
                ctx = ssl.create_default_context()
                for ca in ep.ca:
                    ctx.load_verify_locations(cafile=ca)
                verify_arg = ctx
            client = httpx.AsyncClient(
                verify=verify_arg, follow_redirects=True, trust_env=False,
                timeout=httpx.Timeout(self.TIMEOUT, connect=self.CONNECT_TIMEOUT,
                                      read=self._read_timeout),
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
                headers={"User-Agent": "crishim"})
            self._clients[key] = client
        return client

    def waited(self, exc: BaseException) -> float | None:
        """How long a request waited before `exc` (a timeout) ended it, to say so."""
        if isinstance(exc, httpx.ConnectTimeout):
            return self.CONNECT_TIMEOUT
        if isinstance(exc, httpx.ReadTimeout):
            return self._read_timeout
        return self.TIMEOUT if isinstance(exc, httpx.TimeoutException) else None

    def describe(self, exc: BaseException, url: httpx.URL | str | None = None) -> str:
        """`exc` in the user's words; `url` is where it happened, if the error does not
        carry its request. A domain error's own message is already a sentence."""
        if isinstance(exc, CrishimError):
            return str(exc)
        if not isinstance(exc, httpx.HTTPError | OSError):
            return str(exc) or "an unexpected error"  # a bug: its traceback is logged
        if url is None and isinstance(exc, httpx.RequestError):
            try:
                url = exc.request.url
            except RuntimeError:  # raised without its request
                pass
        where = _where(httpx.URL(url)) if url is not None else "the registry"
        return describe(exc, where, self.waited(exc))

    async def close(self) -> None:
        for c in self._clients.values():
            await c.aclose()
        self._clients.clear()


def _tls_error(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _retryable_status(code: int) -> bool:
    return code == 429 or code >= 500


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host, url.port or default


def _hostname(netloc: str) -> str:
    return (urlsplit("//" + netloc).hostname or "").lower()


MAX_TOKEN_REDIRECTS = 5


@dataclass
class Manifest:
    digest: str
    media_type: str
    body: bytes


class RegistrySession:
    def __init__(self, cfg: RegistryConfig, ref: Reference, creds: Credentials | None,
                 pool: ClientPool, feed: ProgressFeed) -> None:
        self.ref = ref
        self.creds = creds
        self.pool = pool
        self.feed = feed  # manifests and configs report their bytes here
        self.endpoints = endpoints(cfg.config_path, ref.domain)
        self.scope = f"repository:{ref.path}:pull"
        self.registry = registry_host(ref.domain)
        # Authorization header per endpoint host, learned from the first challenge.
        self._auth: dict[str, str] = {}
        # Why credentials were kept from a token realm of an endpoint host (for errors).
        self._withheld: dict[str, str] = {}
        self._auth_lock = asyncio.Lock()
        self._dead: set[str] = set()  # mirrors that failed during this pull

    def _where(self) -> str:
        return f"{self.ref.domain}/{self.ref.path}"

    # --- auth -----------------------------------------------------------------------------
    def _creds_for(self, ep: Endpoint) -> tuple[Credentials | None, str]:
        """The credentials `ep` may receive, or None and why not (said in errors)."""
        creds = self.creds
        if creds is None:
            return None, ""
        target = creds.host(self.ref.domain)
        if registry_host(ep.host) == target:
            return creds, ""
        if target != self.registry:
            return None, (f"the credentials given are for {target} "
                          f"(AuthConfig.server_address), not for {ep.host}")
        if ep.is_mirror and not ep.send_credentials:
            return None, (f"the credentials for {self.ref.domain} are not sent to mirror "
                          f"{ep.host} (hosts.toml: send_credentials)")
        return creds, ""  # the registry's own server, as hosts.toml names it

    def _why_not(self, ep: Endpoint) -> str:
        return self._creds_for(ep)[1] or self._withheld.get(ep.host, "")

    async def _authorize(self, client: httpx.AsyncClient, ep: Endpoint,
                         resp: httpx.Response) -> bool:
        """Answer a 401: store an Authorization for `ep`. False when nothing can help."""
        challenges = parse_challenges(resp.headers.get("WWW-Authenticate", ""))
        creds, _ = self._creds_for(ep)
        for ch in challenges:
            if ch.scheme == "bearer":
                if creds and creds.registry_token:
                    self._auth[ep.host] = "Bearer " + creds.registry_token
                    return True
                token = await self._fetch_token(client, ep, ch, creds)
                self._auth[ep.host] = "Bearer " + token
                return True
            if ch.scheme == "basic" and creds and creds.has_basic:
                self._auth[ep.host] = creds.basic_header()
                return True
        return False

    def _plain_realm_allowed(self, ep: Endpoint, realm_netloc: str) -> bool:
        """A plain-http token realm may see credentials only when the registry itself was
        reached over plain http (loopback, or an http:// URL in hosts.toml) and the realm
        is on the same machine: nothing then crosses a network in clear text that the
        registry's own requests did not already."""
        if not self._base(ep).startswith("http://"):
            return False
        if _hostname(realm_netloc) == _hostname(ep.host):
            return True
        return is_local(ep.host) and is_local(realm_netloc)

    async def _fetch_token(self, client: httpx.AsyncClient, ep: Endpoint, ch: Challenge,
                           creds: Credentials | None) -> str:
        realm = ch.params.get("realm", "")
        parts = urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise Unauthenticated(f"registry {self.ref.domain} sent a bearer challenge "
                                  "without a usable realm")
        if creds and parts.scheme == "http" and not self._plain_realm_allowed(ep, parts.netloc):
            # The registry names where the secret goes; plain http would hand it to anyone
            # on the path. Ask for an anonymous token instead (a public image still pulls).
            why = (f"the credentials were not sent to its token server {parts.netloc} "
                   "over plain http")
            log.warning("registry credentials withheld from a plain-http token realm",
                        registry=ep.host, realm=parts.netloc)
            self._withheld[ep.host] = why
            creds = None
        service = ch.params.get("service", "")
        scope = ch.params.get("scope", "") or self.scope
        try:
            if creds and creds.identity_token:
                # OAuth2 refresh-token grant, as docker/containerd do with identity tokens.
                resp = await self._token_request(client, client.build_request(
                    "POST", realm, data={
                        "grant_type": "refresh_token", "refresh_token": creds.identity_token,
                        "service": service, "scope": scope, "client_id": "crishim"}))
            else:
                params = {"scope": scope}
                if service:
                    params["service"] = service
                if creds and creds.has_basic:
                    resp = await self._token_request(client, client.build_request(
                        "GET", realm, params=params,
                        headers={"Authorization": creds.basic_header()}))
                else:
                    resp = await client.get(realm, params=params)
        except httpx.HTTPError as exc:
            raise Unavailable(f"token server of registry {self.ref.domain}: "
                              f"{self.pool.describe(exc, realm)}") from None
        if resp.status_code in (401, 403):
            raise Unauthenticated(
                f"registry {self.ref.domain} refused a pull token for {self.ref.path}"
                + (": the credentials were rejected" if creds else
                   ": it needs credentials (none were given)"))
        if resp.status_code >= 300:
            raise Unavailable(f"token server of registry {self.ref.domain} answered "
                              f"HTTP {resp.status_code}")
        try:
            body = resp.json()
            token = body.get("token") or body.get("access_token")
        except ValueError:
            token = None
        if not isinstance(token, str) or not token:
            raise Unauthenticated(f"token server of registry {self.ref.domain} returned "
                                  "no token")
        return token

    async def _token_request(self, client: httpx.AsyncClient,
                             req: httpx.Request) -> httpx.Response:
        """Send a token request that carries a secret (a password or an identity token,
        in a header or the body), following redirects only within the realm's origin: a
        token server that sends it elsewhere does not take the secret along."""
        start = _origin(req.url)
        for _ in range(MAX_TOKEN_REDIRECTS + 1):
            resp = await client.send(req, follow_redirects=False)
            nxt = resp.next_request
            if not resp.is_redirect or nxt is None:
                return resp
            await resp.aclose()
            if _origin(nxt.url) != start:
                raise Unauthenticated(
                    f"token server of registry {self.ref.domain} redirected to another host "
                    f"({nxt.url.netloc.decode()}); the credentials are not sent there")
            req = nxt
        raise Unavailable(f"token server of registry {self.ref.domain} redirected more than "
                          f"{MAX_TOKEN_REDIRECTS} times")

    # --- requests -------------------------------------------------------------------------
    def _base(self, ep: Endpoint) -> str:
        if ep.http_fallback and ep.host in self.pool.plain_http:
            return self.pool.plain_http[ep.host]
        return ep.base

    async def _send(self, ep: Endpoint, method: str, path: str, headers: dict[str, str],
                    stream: bool, transfer: Transfer) -> httpx.Response:
        """One request with auth and retries; 2xx/4xx responses are returned."""
        client = self.pool.get(ep)
        transfer.host = ep.host
        params = {"ns": self.ref.domain} if ep.is_mirror else None
        authorized = False
        attempt = 0
        while True:
            base = self._base(ep)
            hdrs = {**ep.headers, **headers}
            auth = self._auth.get(ep.host)
            if auth:
                hdrs["Authorization"] = auth
            req = client.build_request(method, base + path, headers=hdrs, params=params)
            try:
                resp = await client.send(req, stream=stream)
                transfer.advance(0)  # headers arrived: the registry is answering
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if ep.http_fallback and base != ep.http_fallback and \
                        not base.startswith("http://"):
                    # A local registry that speaks plain HTTP: remember and retry.
                    self.pool.plain_http[ep.host] = ep.http_fallback
                    continue
                # A mirror that cannot be reached is skipped at once: the next host serves.
                # A certificate problem does not heal by retrying.
                if ep.is_mirror or attempt >= RETRIES - 1 or _tls_error(exc):
                    raise Unavailable(self.pool.describe(exc, req.url)) from None
            except httpx.TransportError as exc:
                if attempt >= RETRIES - 1:
                    raise Unavailable(self.pool.describe(exc, req.url)) from None
            else:
                final = resp.request.url
                if resp.status_code == 401 and _origin(final) != _origin(req.url):
                    # httpx dropped the Authorization on the way (another origin); the
                    # redirect target's challenge is not answered with this host's secrets.
                    await resp.aclose()
                    raise Unauthenticated(
                        f"registry {ep.host} redirected {self.ref.path} to {final.host}, "
                        "which asks for authentication; credentials are not sent to "
                        "another host")
                if resp.status_code == 401 and not authorized:
                    await resp.aclose()
                    async with self._auth_lock:
                        if self._auth.get(ep.host) == auth or auth is None:
                            if not await self._authorize(client, ep, resp):
                                why = self._why_not(ep)
                                raise Unauthenticated(
                                    f"registry {ep.host} requires authentication for "
                                    f"{self.ref.path}"
                                    + (f"; {why}" if why else
                                       " and rejected the given credentials"
                                       if self.creds else "; no credentials were given"))
                    transfer.advance(0)  # the token server answered
                    authorized = True
                    continue
                if resp.status_code in (401, 403):
                    await resp.aclose()
                    why = self._why_not(ep)
                    raise Unauthenticated(f"registry {ep.host} denied access to "
                                          f"{self.ref.path} (HTTP {resp.status_code})"
                                          + (f"; {why}" if why else ""))
                if not _retryable_status(resp.status_code) or attempt >= RETRIES - 1:
                    return resp
                await resp.aclose()
            await asyncio.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
            attempt += 1

    async def _try_endpoints(self, capability: str, method: str, path: str,
                             headers: dict[str, str], stream: bool, what: str,
                             transfer: Transfer) -> httpx.Response:
        last: Exception | None = None
        # What each endpoint asked said, in order, for an error that names them all.
        tried: list[str] = []
        for ep in self.endpoints:
            if capability not in ep.capabilities:
                continue
            name = f"mirror {ep.host}" if ep.is_mirror else ep.host
            if ep.base in self._dead:
                tried.append(f"{name} was skipped (it failed earlier in this pull)")
                continue
            try:
                resp = await self._send(ep, method, path, headers, stream, transfer)
            except (Unavailable, Unauthenticated) as exc:
                if ep.is_mirror:
                    log.info("registry mirror failed, trying next", mirror=ep.host,
                             error=str(exc))
                    self._dead.add(ep.base)  # not again during this pull
                    tried.append(f"{name}: {exc}")
                    last = exc
                    continue
                if tried:
                    raise type(exc)(f"{what}: {', then '.join(tried)}, then {name}: "
                                    f"{exc}") from None
                raise
            if resp.status_code < 300:
                return resp
            await resp.aclose()
            tried.append(f"{name} answered {resp.status_code}")
            if resp.status_code == 404:
                last = NotFound(f"{what} not found in registry {ep.host}")
            else:
                last = Unavailable(f"registry {ep.host} answered HTTP {resp.status_code} "
                                   f"for {what}")
            if not ep.is_mirror:
                break
        if last is None:
            raise Unavailable(f"no registry endpoint of {self.ref.domain} can {capability}"
                              + (f": {', then '.join(tried)}" if tried else ""))
        if len(tried) > 1:
            # Which endpoint gave the last answer is not enough: a mirror's 404 or refusal
            # before it is often the reason (a mirror that lacks the image, a typo).
            said = "not found" if isinstance(last, NotFound) else "unavailable"
            last = type(last)(f"{what} {said}: {', then '.join(tried)}")
        raise last

    # --- manifests and blobs --------------------------------------------------------------
    async def _read_limited(self, resp: httpx.Response, limit: int, what: str,
                            transfer: Transfer) -> bytes:
        chunks: list[bytes] = []
        total = 0
        try:
            async for chunk in resp.aiter_raw():
                transfer.advance(len(chunk))
                total += len(chunk)
                if total > limit:
                    raise FailedPrecondition(f"{what} is larger than {limit} bytes; refusing it")
                chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise Unavailable(f"{what}: download failed: "
                              f"{self.pool.describe(exc, resp.request.url)}") from None
        finally:
            await resp.aclose()
        return b"".join(chunks)

    async def manifest(self, obj: str) -> Manifest:
        """Fetch a manifest by tag or digest; verified against the digest when given."""
        by_digest = ":" in obj
        what = f"manifest {self._where()}{'@' if by_digest else ':'}{obj}"
        with self.feed.transfer(f"manifest {obj}", self.ref.domain) as t:
            resp = await self._try_endpoints("pull" if by_digest else "resolve", "GET",
                                             f"/{self.ref.path}/manifests/{obj}",
                                             {"Accept": ", ".join(MANIFEST_TYPES)}, True, what,
                                             t)
            media = resp.headers.get("Content-Type", "").split(";")[0].strip()
            body = await self._read_limited(resp, MAX_MANIFEST, what, t)
        if by_digest:
            verify(body, obj, what)
            digest = obj
        else:
            digest = digest_of(body)
            header = resp.headers.get("Docker-Content-Digest", "")
            if header and header.startswith("sha256:") and header != digest:
                raise BlobMismatch(f"{what}: content digest {digest} does not match the "
                                   f"registry's Docker-Content-Digest {header}")
        return Manifest(digest, media, body)

    async def blob_bytes(self, digest: str, limit: int = MAX_CONFIG) -> bytes:
        what = f"blob {self._where()}@{digest}"
        for attempt in range(RETRIES):
            with self.feed.transfer(f"blob {digest}", self.ref.domain) as t:
                resp = await self._try_endpoints(
                    "pull", "GET", f"/{self.ref.path}/blobs/{digest}", {}, True, what, t)
                try:
                    body: bytes | None = await self._read_limited(resp, limit, what, t)
                except Unavailable:  # the body broke off: ask again
                    if attempt == RETRIES - 1:
                        raise
                    body = None
            if body is None:
                await asyncio.sleep(BACKOFF[attempt])
                continue
            verify(body, digest, what)
            return body
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def open_blob(self, digest: str, transfer: Transfer) -> AsyncIterator[httpx.Response]:
        """A streaming response for a blob; the caller verifies its digest and reports the
        bytes it reads to `transfer`."""
        what = f"blob {self._where()}@{digest}"
        resp = await self._try_endpoints("pull", "GET", f"/{self.ref.path}/blobs/{digest}",
                                         {}, True, what, transfer)
        try:
            yield resp
        finally:
            await resp.aclose()


def _causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 8 and seen not in out:
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


_SSL_TEXT = re.compile(r"^\[[^\]]*\]\s*|\s*\(_ssl\.c:\d+\)$")


def _ssl_reason(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    text = _SSL_TEXT.sub("", str(exc)).strip()
    return text or str(exc.reason or "").lower().replace("_", " ") or "no reason given"


def describe(exc: BaseException, where: str, waited: float | None = None) -> str:
    """A failure to talk to `where` (host:port) as a sentence in the user's words: what
    happened and with which host, never an exception's class or an errno's text."""
    host = _hostname(where) or where
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        within = f" within {waited:g}s" if waited else " in time"
        return f"{where} did not answer{within}"
    causes = _causes(exc)
    for cause in causes:
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve registry host {host}"
        if isinstance(cause, ssl.SSLError):
            return f"TLS handshake with {where} failed: {_ssl_reason(cause)}"
        if isinstance(cause, ConnectionRefusedError):
            return f"connection refused by {where}"
        if isinstance(cause, ConnectionResetError):
            return f"{where} reset the connection"
    if isinstance(exc, httpx.RemoteProtocolError):
        text = str(exc).rstrip(".")
        return f"{where} broke off the HTTP exchange" + (
            f": {text[:1].lower()}{text[1:]}" if text else "")
    for cause in causes:
        if isinstance(cause, OSError) and cause.strerror:
            return f"the connection to {where} failed: {cause.strerror.lower()}"
    if isinstance(exc, httpx.HTTPError):
        return f"the connection to {where} failed"
    return f"the exchange with {where} failed: {exc}"


def _where(url: httpx.URL) -> str:
    """host:port of a request's URL, the port always said (443 for https)."""
    _, host, port = _origin(url)
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port else host


__all__: list[Any] = ["BlobMismatch", "ClientPool", "Manifest", "RegistrySession", "verify"]
