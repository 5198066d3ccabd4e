"""A registry that cannot be reached, in the user's words: each network failure of a
pull is a sentence naming the host (cannot resolve, connection refused, TLS handshake,
no answer in time), and a pull through mirrors names every endpoint it asked and what
each said. No exception class or errno text reaches the message.

Real RegistrySessions (httpx, hosts.toml) against `.invalid` names (which never
resolve), closed loopback ports and small fake registries on 127.0.0.1: no traffic
leaves the machine."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from crishim.config import RegistryConfig
from crishim.errors import CrishimError, NotFound, Unavailable
from crishim.image import reference
from crishim.image.client import ClientPool, RegistrySession
from crishim.image.progress import ProgressFeed
from tests.fakes.registries import Fake, World, send
from tests.fakes.registries import world as world  # the fixture

PYTHON_WORDS = ("Error", "Errno", "Exception", "Timeout(", "_ssl.c")


class Missing(Fake):
    """A registry (or mirror) that has nothing: 404 for every request."""

    async def _answer(self, w: asyncio.StreamWriter, method: str, path: str, auth: str,
                      body: bytes) -> None:
        await send(w, 404, b"{}", {"Content-Type": "application/json"})


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _failure(w: World, image: str, read_timeout: float = 10.0) -> CrishimError:
    pool = ClientPool(read_timeout)
    try:
        s = RegistrySession(RegistryConfig(config_path=str(w.dir)), reference.parse(image),
                            None, pool, ProgressFeed())
        with pytest.raises(CrishimError) as err:
            await s.manifest("v1")
        message = str(err.value)
        assert not any(word in message for word in PYTHON_WORDS), message
        return err.value
    finally:
        await pool.close()


async def _missing(w: World, name: str) -> Missing:
    f = Missing(name, w.log)
    await f.start()
    w.fakes.append(f)
    return f


async def test_a_registry_name_that_does_not_resolve(world: World) -> None:
    err = await _failure(world, "nothere.invalid/t/app:v1")
    assert isinstance(err, Unavailable)
    assert str(err) == "cannot resolve registry host nothere.invalid"


async def test_a_closed_port(world: World) -> None:
    port = _closed_port()
    world.hosts("registry.test", f'server = "http://127.0.0.1:{port}"\n')
    err = await _failure(world, "registry.test/t/app:v1")
    assert isinstance(err, Unavailable)
    assert str(err) == f"connection refused by 127.0.0.1:{port}"


async def test_a_certificate_that_is_not_trusted(world: World) -> None:
    reg = await world.fake("registry", tls=True)
    world.hosts("registry.test", f'server = "{reg.url}"\n')
    err = await _failure(world, "registry.test/t/app:v1")
    assert str(err) == (f"TLS handshake with {reg.host} failed: certificate verify failed: "
                        "self-signed certificate")


@pytest.fixture
async def silent() -> AsyncIterator[int]:
    """A port that accepts connections and never answers."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def test_a_registry_that_does_not_answer(world: World, silent: int) -> None:
    world.hosts("registry.test", f'server = "http://127.0.0.1:{silent}"\n')
    err = await _failure(world, "registry.test/t/app:v1", read_timeout=0.2)
    assert str(err) == f"127.0.0.1:{silent} did not answer within 0.2s"


async def test_a_mirror_that_answers_404_is_named_with_the_registry_s_answer(
        world: World) -> None:
    reg, mirror = await _missing(world, "registry"), await _missing(world, "mirror")
    world.hosts("registry.test", f'server = "{reg.url}"\n'
                f'[host."{mirror.url}"]\n  capabilities = ["pull", "resolve"]\n')
    err = await _failure(world, "registry.test/t/app:v1")
    assert isinstance(err, NotFound)
    assert str(err) == (f"manifest registry.test/t/app:v1 not found: mirror {mirror.host} "
                        f"answered 404, then {reg.host} answered 404")


async def test_mirrors_that_cannot_be_reached_are_each_named(world: World) -> None:
    reg, port = await _missing(world, "registry"), _closed_port()
    world.hosts("registry.test", f'server = "{reg.url}"\n'
                '[host."https://mirror.invalid"]\n  capabilities = ["pull", "resolve"]\n'
                f'[host."http://127.0.0.1:{port}"]\n  capabilities = ["pull", "resolve"]\n')
    err = await _failure(world, "registry.test/t/app:v1")
    assert isinstance(err, NotFound)
    assert str(err) == (
        "manifest registry.test/t/app:v1 not found: mirror mirror.invalid: cannot resolve "
        f"registry host mirror.invalid, then mirror 127.0.0.1:{port}: connection refused "
        f"by 127.0.0.1:{port}, then {reg.host} answered 404")


async def test_a_registry_that_fails_after_a_mirror_names_both(world: World) -> None:
    mirror, port = await _missing(world, "mirror"), _closed_port()
    world.hosts("registry.test", f'server = "http://127.0.0.1:{port}"\n'
                f'[host."{mirror.url}"]\n  capabilities = ["pull", "resolve"]\n')
    err = await _failure(world, "registry.test/t/app:v1")
    assert isinstance(err, Unavailable)
    assert str(err) == (f"manifest registry.test/t/app:v1: mirror {mirror.host} answered "
                        f"404, then 127.0.0.1:{port}: connection refused by "
                        f"127.0.0.1:{port}")


def test_a_broken_exchange_and_a_bug_are_said_without_class_names() -> None:
    pool = ClientPool(None)
    url = "https://registry.test/v2/t/app/blobs/sha256:aa"
    assert pool.describe(httpx.RemoteProtocolError("Server disconnected."), url) == \
        "registry.test:443 broke off the HTTP exchange: server disconnected"
    assert pool.describe(httpx.ReadError("")) == "the connection to the registry failed"
    assert pool.describe(Unavailable("connection refused by x:443")) == \
        "connection refused by x:443"
    assert pool.describe(ValueError("bad value")) == "bad value"
