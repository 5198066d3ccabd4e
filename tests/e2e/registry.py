"""A real Docker distribution registry (Debian's /usr/bin/docker-registry) for e2e tests.

    with Registry() as reg:                        # plain HTTP on 127.0.0.1:<free port>
        push_busybox(reg.host, "test/busybox")
    with Registry(users={"alice": "s3cret"}) as reg:   # htpasswd basic auth
        ...

Everything (storage, config, htpasswd) lives in a temp dir that is removed on exit.
`TokenProxy` puts a bearer-token front (WWW-Authenticate: Bearer realm=...) before a
registry, so the client's token flow is exercised against the real registry behind it.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import http.client
import json
import os
import secrets
import select
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

REGISTRY_BIN = "/usr/bin/docker-registry"


# Looked up once here: after fork only the call itself happens (no dlopen in the child).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the test process dies (even by SIGKILL), so a killed
    test run never leaves a registry behind."""
    _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bcrypt(password: str) -> str:
    # docker-registry's htpasswd only accepts bcrypt; glibc/libxcrypt's crypt() does it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # stdlib until 3.13; enough for a test helper

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


def self_signed(cert_path: str, key_path: str) -> None:
    """A self-signed certificate for 127.0.0.1/localhost (it is its own CA)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "crishim-test-registry")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    with open(cert_path, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM,
                                   serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


class Registry:
    """docker-registry on 127.0.0.1:<free port>, optionally with htpasswd basic auth."""

    def __init__(self, users: Mapping[str, str] | None = None, *, delete: bool = True,
                 tls: bool = False) -> None:
        self.users = dict(users or {})
        self.delete = delete
        self.tls = tls  # HTTPS with a self-signed cert for 127.0.0.1 (see .ca_file)
        self.dir = ""
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}"

    @property
    def push_host(self) -> str:
        """What imagebuild's push functions take: host, or https://host for TLS."""
        return self.url if self.tls else self.host

    @property
    def ca_file(self) -> str:
        return os.path.join(self.dir, "cert.pem")

    @property
    def storage(self) -> str:
        return os.path.join(self.dir, "storage")

    def basic_auth(self) -> tuple[str, str] | None:
        """(user, password) of the first user, for pushing to an auth registry."""
        return next(iter(self.users.items()), None)

    def _config(self) -> str:
        lines = [
            "version: 0.1",
            "log:",
            "  level: error",
            "  accesslog:",
            "    disabled: true",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {self.storage}",
            "  delete:",
            f"    enabled: {'true' if self.delete else 'false'}",
            "http:",
            f"  addr: 127.0.0.1:{self.port}",
            f"  secret: {secrets.token_hex(16)}",
        ]
        if self.tls:
            lines += ["  tls:", f"    certificate: {self.ca_file}",
                      f"    key: {os.path.join(self.dir, 'key.pem')}"]
        # Let tests push manifests with foreign/non-distributable layers (with urls).
        lines += ["validation:", "  manifests:", "    urls:", "      allow:",
                  "        - ^https?://"]
        if self.users:
            lines += ["auth:", "  htpasswd:", "    realm: crishim-test",
                      f"    path: {os.path.join(self.dir, 'htpasswd')}"]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 15.0) -> Registry:
        self.dir = tempfile.mkdtemp(prefix="crishim-registry-")
        os.makedirs(self.storage)
        if self.tls:
            self_signed(self.ca_file, os.path.join(self.dir, "key.pem"))
        if self.users:
            with open(os.path.join(self.dir, "htpasswd"), "w") as fh:
                for user, pw in self.users.items():
                    fh.write(f"{user}:{_bcrypt(pw)}\n")
        for _attempt in range(5):  # the free port may be taken between probe and bind
            self.port = free_port()
            cfg = os.path.join(self.dir, "config.yml")
            with open(cfg, "w") as fh:
                fh.write(self._config())
            log = open(os.path.join(self.dir, "registry.log"), "ab")
            self.proc = subprocess.Popen([REGISTRY_BIN, "serve", cfg], stdout=log,
                                         stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
            log.close()
            if self._wait_ready(timeout):
                return self
            self._kill()
        self.close()
        raise RuntimeError(f"docker-registry did not start:\n{self.logs()}")

    def _wait_ready(self, timeout: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                ctx = ssl._create_unverified_context() if self.tls else None
                urllib.request.urlopen(self.url + "/v2/", timeout=1, context=ctx).close()
                return True
            except urllib.error.HTTPError as exc:
                if exc.code == 401:  # auth enabled: it answers, so it is up
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def logs(self) -> str:
        try:
            with open(os.path.join(self.dir, "registry.log"), errors="replace") as fh:
                return fh.read()[-5000:]
        except OSError:
            return ""

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self._kill()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# --- an HTTP front for a registry: bearer tokens and fault injection ----------------------

Fault = Callable[[str, str], "tuple[int, bytes] | tuple[int, bytes, dict[str, str]] | str | None"]
"""fault(method, path) -> None (forward), (status, body[, headers]) to answer instead (e.g.
a 307 with a Location header to test redirects), or one of
"corrupt" (flip a byte of the body), "truncate" (send half the body, then drop the
connection), "stall" (send the headers and `stall_bytes` of the body, then nothing),
"silent" (accept the request and send nothing at all), "slow" (the whole body in
`trickle` = (pieces, seconds between them)). A stalled or silent request waits until
the client drops the connection (counted in `dropped`) or the proxy closes."""


class QuietHandler(BaseHTTPRequestHandler):
    """A test server's request handler: HTTP/1.1, no log lines, `_send` for a whole reply."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: Mapping[str, str] = {}) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class TokenProxy:
    """Reverse proxy in front of `upstream` (host:port) on its own free port.

    With `token_users` it answers 401 `WWW-Authenticate: Bearer realm=<self>/token,...`
    until a request carries a token it issued at /token to a user who authenticated with
    basic auth there (or anonymously when `anonymous=True`). `fault` can answer or break
    chosen requests. `requests` records (method, path, had_auth) for assertions.
    """

    def __init__(self, upstream: str, *, token_users: Mapping[str, str] | None = None,
                 anonymous: bool = False, fault: Fault | None = None,
                 upstream_auth: tuple[str, str] | None = None, stall_bytes: int = 65536,
                 trickle: tuple[int, float] = (8, 1.0)) -> None:
        self.upstream = upstream
        self.stall_bytes = stall_bytes
        self.trickle = trickle
        self.dropped = 0  # stalled/silent requests whose client closed the connection
        self._closing = threading.Event()
        self.token_users = dict(token_users or {})
        self.anonymous = anonymous
        self.fault = fault
        self.upstream_auth = upstream_auth
        self._lock = threading.Lock()
        self.tokens: set[str] = set()
        # identity tokens (refresh tokens) accepted by POST /token
        self.refresh_tokens: set[str] = set()
        self.requests: list[tuple[str, str, bool]] = []
        self.token_requests: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(QuietHandler):
            def _token(self) -> None:
                proxy.token_requests.append(self.path)
                auth = self.headers.get("Authorization", "")
                ok = proxy.anonymous and not auth
                if self.command == "POST":  # OAuth2 refresh-token grant (identity tokens)
                    length = int(self.headers.get("Content-Length") or 0)
                    form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                    ok = (form.get("grant_type") == ["refresh_token"] and
                          form.get("refresh_token", [""])[0] in proxy.refresh_tokens)
                elif auth.startswith("Basic "):
                    user, _, pw = base64.b64decode(auth[6:]).decode().partition(":")
                    ok = proxy.token_users.get(user) == pw
                if not ok:
                    self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
                    return
                token = secrets.token_hex(16)
                proxy.tokens.add(token)
                body = json.dumps({"token": token, "access_token": token,
                                   "expires_in": 300}).encode()
                self._send(200, body, {"Content-Type": "application/json"})

            def _handle(self) -> None:
                if self.path.startswith("/token"):
                    self._token()
                    return
                auth = self.headers.get("Authorization", "")
                had_auth = bool(auth)
                proxy.requests.append((self.command, self.path, had_auth))
                if proxy.token_users or proxy.anonymous:
                    if not (auth.startswith("Bearer ") and auth[7:] in proxy.tokens):
                        scope = ""
                        parts = self.path.split("/")
                        if len(parts) > 3 and parts[1] == "v2":
                            kind = "blobs" if "/blobs/" in self.path else "manifests"
                            repo = self.path[4:self.path.index("/" + kind + "/")]
                            scope = f',scope="repository:{repo}:pull"'
                        challenge = (f'Bearer realm="{proxy.url}/token",'
                                     f'service="crishim-test"{scope}')
                        self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                                   {"WWW-Authenticate": challenge,
                                    "Content-Type": "application/json"})
                        return
                action = proxy.fault(self.command, self.path) if proxy.fault else None
                if action == "silent":
                    self._hold()
                    return
                if isinstance(action, tuple):
                    self._send(action[0], action[1], action[2] if len(action) > 2 else {})
                    return
                self._forward(action)

            def _hold(self) -> None:
                """Send nothing more until the client hangs up or the proxy closes."""
                self.close_connection = True
                while not proxy._closing.is_set():
                    ready, _, _ = select.select([self.connection], [], [], 0.1)
                    if ready:
                        try:
                            if self.connection.recv(4096):
                                continue  # more from the client: not an answer it gets
                        except OSError:
                            pass
                        with proxy._lock:
                            proxy.dropped += 1
                        return

            def _forward(self, action: str | None) -> None:
                conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("authorization", "host", "connection")}
                if proxy.upstream_auth:
                    raw = ":".join(proxy.upstream_auth).encode()
                    headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                out_headers = {k: v for k, v in resp.getheaders()
                               if k.lower() not in ("content-length", "connection",
                                                    "transfer-encoding")}
                if action == "corrupt" and data:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                if action in ("stall", "slow") and data:
                    self.send_response(resp.status)
                    for k, v in out_headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if action == "stall":
                        self.wfile.write(data[:min(proxy.stall_bytes, len(data) - 1)])
                        self.wfile.flush()
                        self._hold()
                        return
                    pieces, gap = proxy.trickle
                    step = -(-len(data) // pieces)
                    for i in range(0, len(data), step):
                        self.wfile.write(data[i:i + step])
                        self.wfile.flush()
                        if i + step < len(data):
                            time.sleep(gap)
                    return
                if action == "truncate" and data:
                    self.send_response(resp.status)
                    for k, v in out_headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self._send(resp.status, data, out_headers)

            do_GET = _handle
            do_HEAD = _handle
            do_POST = _handle
            do_PUT = _handle
            do_PATCH = _handle
            do_DELETE = _handle

        return Handler

    def start(self) -> TokenProxy:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> TokenProxy:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
